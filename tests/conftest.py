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
