"""Errors a user can fix; the command line prints them in one line."""

import contextlib
import logging


class UserError(Exception):
  """A mistake in the config, the data or the workdir, with what to do."""


class ConfigError(UserError, ValueError):
  """A config value is invalid; the message names the key."""


class DataError(ConfigError):
  """A dataset file is missing, empty or holds a bad record; the message
  names the dataset and the file (a mistake in the run's inputs, like a
  config value, whenever it is found)."""


class ResumeError(UserError):
  """The workdir's checkpoint does not fit this run's config or data."""


class TrainingError(UserError):
  """Training cannot go on (e.g. NaN after NaN, no disk space)."""


@contextlib.contextmanager
def absl_warnings_muted():
  """Mutes absl's warnings (orbax, TFDS, config_flags log through it) inside
  the block, where the error raised, or the state asked for, already says
  what they would."""
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl_logger.setLevel(level)
