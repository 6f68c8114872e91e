"""`python -m jaxgrpo.stratify`: the `jaxgrpo-stratify` command line."""

import sys

from jaxgrpo.stratify import cli

if __name__ == '__main__':
  sys.exit(cli.main())
