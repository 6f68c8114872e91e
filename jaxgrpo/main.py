"""`python -m jaxgrpo.main`: the `jaxgrpo-train` command (`jaxgrpo.cli.train`).

Kept as the short, stable spelling that the docs, notebooks and TPU VM
scripts use; the command line itself lives in `jaxgrpo.cli`.
"""

from jaxgrpo.cli import train

if __name__ == '__main__':
  train.run_cli()
