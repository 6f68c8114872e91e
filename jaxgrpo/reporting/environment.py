"""The machine and packages that produced a result.

XLA's CPU float results depend on the CPU (its vector instructions) and on
the jax / jaxlib build as well as on the program, so experiment runs
(scripts/reproduce.py), benchmarks and the pinned demo metrics
(tests/test_pinned.py) record them with their numbers, all read here.
"""

import importlib.metadata
import os
import platform

PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'numpy')
# The vector instructions that change which kernels XLA's CPU backend emits.
CPU_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'amx_tile')


def cpu() -> tuple[str, tuple[str, ...]]:
  """(model name, those of `CPU_FLAGS` it has, sorted); off Linux, the
  platform's processor name and no flags."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      info = {}
      for line in f:
        if not line.strip():  # the first processor's block is enough
          break
        key, _, value = line.partition(':')
        info[key.strip()] = value.strip()
    model, flags = info.get('model name', model), set(info.get(
        'flags', '').split())
  except OSError:
    pass
  return model, tuple(sorted(flags & set(CPU_FLAGS)))


def cpu_name() -> str:
  """The CPU model followed by its `CPU_FLAGS`, as results record it."""
  model, flags = cpu()
  return ' '.join([model, *flags])


def usable_cores() -> int:
  """The cores this process may run on (its affinity where the OS has one)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def environment() -> dict:
  """The packages (`PACKAGES`' versions, None where missing), Python, the
  CPU model with its flags and the machine's core count."""
  packages = {}
  for name in PACKAGES:
    try:
      packages[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      packages[name] = None
  return {'packages': packages, 'python': platform.python_version(),
          'cpu': cpu_name(), 'cores': os.cpu_count()}
