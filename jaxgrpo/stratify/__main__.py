"""`python -m jaxgrpo.stratify`: the `jaxgrpo-stratify` command line."""

from jaxgrpo.cli import stratify as command

if __name__ == '__main__':
  command.run_cli()
