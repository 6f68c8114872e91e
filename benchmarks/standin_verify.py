"""Stand-in verifiers for benchmarks/grpo_step.py (no JAX: worker-importable).

One example in ten of three (by a hash of its id) gets a reward from a
hash of each completion's text, so its group of random-model completions
is mixed (informative) unless all G hashes agree; the others are always
right (too easy) or always wrong (too hard). About 30% of groups are
informative, the same ones on every run.
"""

import time
import zlib


def hashed(text, example) -> float:
  kind = zlib.crc32(example.id.encode()) % 10
  if kind < 3:
    return float(zlib.crc32(text.encode()) % 2)
  return float(kind < 7)


def slow(text, example) -> float:
  """`hashed` after 50 ms, standing in for code execution."""
  time.sleep(0.05)
  return hashed(text, example)
