"""Counter-based randomness: values computed from keys, no state to save.

`mix` is splitmix64's finaliser on uint64 arrays, `fold` folds integers into
one 64-bit key, and `feistel` is a keyed bijection of [0, 2^bits): the
snooze tables walk each epoch in its order and draw their skips from
`mix` of (seed, epoch, index), so a resumed run repeats them exactly.
"""

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z: np.ndarray) -> np.ndarray:
  """splitmix64 of a 1-D uint64 array (array arithmetic wraps silently)."""
  z = z + np.uint64(GOLDEN)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def fold(*words: int) -> np.uint64:
  """Folds integers into one 64-bit key (1-D arrays: no overflow warnings)."""
  h = np.zeros(1, np.uint64)
  for w in words:
    h = mix(h ^ np.uint64(w & M64))
  return h[0]


def feistel(x: np.ndarray, keys: tuple[np.uint64, ...], bits: int,
            inverse: bool) -> np.ndarray:
  """A keyed bijection of [0, 2^bits) on uint64 arrays (or its inverse)."""
  # Unbalanced halves swap widths each round: (hi, lo) -> (lo, hi).
  wa, wb = bits - bits // 2, bits // 2
  mask = {w: np.uint64((1 << w) - 1) for w in (wa, wb)}
  a, b = x >> np.uint64(wb), x & mask[wb]
  if not inverse:
    for k in keys:
      a, b = b, a ^ (mix(b ^ k) & mask[wa])
      wa, wb = wb, wa
  else:
    for k in reversed(keys):
      a, b = b ^ (mix(a ^ k) & mask[wb]), a
      wa, wb = wb, wa
  return (a << np.uint64(wb)) | b
