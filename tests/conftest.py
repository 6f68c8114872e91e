"""pytest set-up shared by all tests."""

import os
import tempfile

# Many tests build the same tiny models, train steps and generators; JAX's
# persistent compilation cache lets each compile happen once per machine
# instead of once per test (subprocesses inherit it through the
# environment). Set JAX_COMPILATION_CACHE_DIR to choose the folder, or to
# an empty string to compile everything afresh.
os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR',
    os.path.join(tempfile.gettempdir(),
                 f'jaxgrpo-tests-jax-cache-{os.getuid()}'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import jax

# absltest helpers (create_tempdir, ...) read absl flags; pytest parses none.
flags.FLAGS.mark_as_parsed()

# Implicit rank promotion hides shape bugs; make it an error everywhere.
jax.config.update('jax_numpy_rank_promotion', 'raise')

# Modules whose tests take the longest (a real model, several processes, a
# benchmark script or a whole run each; `--durations` lists them). They run
# first, each module's tests in their order, so that under `-n 2` the two
# workers end together on short tests instead of one finishing a long one
# alone.
_FIRST = (
    'tests/test_notebooks.py',
    'tests/test_multihost.py',
    'tests/model/test_hf_sampling_parity.py',
    'tests/test_benchmarks.py',
    'tests/model/test_gguf_gemma.py',
    'tests/model/test_gguf_qwen3.py',
    'tests/test_resume.py',
    'tests/test_sharding.py',
    'tests/generate/test_continuous.py',
)


def pytest_collection_modifyitems(items):
  """Puts the modules of `_FIRST` first, in its order (a stable sort)."""
  rank = {path: i for i, path in enumerate(_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split('::')[0],
                                       len(_FIRST)))
