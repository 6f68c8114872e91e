"""`python -m jaxgrpo.stratify`: the `jaxgrpo-stratify` command line."""

import sys

from jaxgrpo.cli import stratify as command

if __name__ == '__main__':
  sys.exit(command.main())
