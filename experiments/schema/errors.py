"""The one-line user errors of the experiments (`ConfigError`) and the checks that raise them
naming the config field: `fail`, `check`, `positive_int`, `user_errors`.

Below `experiments.schema.check` and `experiments.schema.rules`, which both raise them.
"""

from __future__ import annotations

import contextlib
from typing import Any


class ConfigError(ValueError):
  """A user error (a config value, a missing file, a workdir mismatch), reported in one line."""


def fail(field: str, value: Any, need: str, *, prefix: str = "config.") -> ConfigError:
  """The error for `config.<field>=<value>` with what is allowed (`prefix=""` for a function
  argument rather than a config field)."""
  return ConfigError(f"{prefix}{field}={value!r} is invalid: {need}.")


@contextlib.contextmanager
def user_errors(what: str):
  """Turns ValueError / OSError raised inside (bad data, a missing file) into a ConfigError
  prefixed with `what` (e.g. "config.data"); the original stays chained as the cause."""
  try:
    yield
  except ConfigError:
    raise
  except (ValueError, OSError) as e:
    raise ConfigError(f"{what}: {e}") from e


def check(cond: bool, field: str, value: Any, need: str, *, prefix: str = "config.") -> None:
  """Raises ConfigError (a ValueError) naming the config field when `cond` is false."""
  if not cond:
    raise fail(field, value, need, prefix=prefix)


def positive_int(value: Any, field: str) -> int:
  check(
    isinstance(value, int) and not isinstance(value, bool) and value >= 1,
    field,
    value,
    "need an int >= 1",
  )
  return int(value)
