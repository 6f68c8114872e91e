"""Running a check script in a subprocess, where it forces its CPU devices.

jax fixes its device count when it is imported, so the checks that compare
a mesh of forced CPU devices with one device run in a process of their own
(`tests/sharded_check.py`, `tests/generate/continuous_sharded.py`,
`tests/rl/streaming_sharded.py`; each adds
`--xla_force_host_platform_device_count` to XLA_FLAGS).
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Compile faster: a check compares sharded with unsharded programs built
# with the same flags, so codegen quality does not matter.
FAST_COMPILE = ('--xla_backend_optimization_level=0 '
                '--xla_llvm_disable_expensive_passes=true')


def run(test, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  """`python ARGS` from the repository root, with the package on the path
  and XLA's fast-compile flags; fails `test` unless it exits 0."""
  env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS=FAST_COMPILE)
  proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
  test.assertEqual(proc.returncode, 0, msg=proc.stderr[-4000:])
  return proc
