"""Errors a user can fix; the command line prints them in one line."""


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
