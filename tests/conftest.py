"""pytest set-up shared by all tests."""

from absl import flags
import jax

# absltest helpers (create_tempdir, ...) read absl flags; pytest parses none.
flags.FLAGS.mark_as_parsed()

# Implicit rank promotion hides shape bugs; make it an error everywhere.
jax.config.update('jax_numpy_rank_promotion', 'raise')
