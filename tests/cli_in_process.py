"""`jaxgrpo-train`'s command line run in the test's own process.

For the many mistakes that end a run before it trains (a bad config value,
a dataset file that cannot be read): each would otherwise pay a new
process's imports, two seconds or more. Each test that uses it also runs
one case as a real process (`python -m jaxgrpo.main`), which checks what
only a process shows: its exit status and everything else on stderr.
"""

import contextlib
import io
import subprocess

from absl import logging as absl_logging

from jaxgrpo.cli import train as cli_train


def run(*argv: str) -> subprocess.CompletedProcess:
  """Runs `jaxgrpo-train ARGV` here: its exit code, stdout and stderr.

  What the command sets for its process (libraries' log filters, absl's
  verbosity) is put back afterwards.
  """
  out, err = io.StringIO(), io.StringIO()
  verbosity = absl_logging.get_verbosity()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      code = cli_train.main(list(argv))
  finally:
    cli_train._quiet_logs(False)  # pylint: disable=protected-access
    absl_logging.set_verbosity(verbosity)
  return subprocess.CompletedProcess(['jaxgrpo-train', *argv], code,
                                     out.getvalue(), err.getvalue())
