"""Argument checks shared by the library's entry points (one wording for each kind of error)."""

from typing import Any

import jax


def positive_int(value: Any, name: str, *, static: bool = True) -> int:
  """``value`` if it is a Python int >= 1 (not a bool); else a ValueError naming ``name``.

  ``static=True`` says why it must be a Python int: it decides shapes of compiled code.
  """
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    why = " (it is static)" if static else ""
    raise ValueError(f"{name}={value!r} must be a positive Python int{why}.")
  return value


def concrete_float(x: Any) -> float | None:
  """``float(x)`` when ``x`` is a concrete scalar; None when it is traced (no check possible)."""
  try:
    return float(x)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return None
