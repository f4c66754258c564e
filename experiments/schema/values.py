"""The declaration of a config field (`Field`: default, rule, help) and of a config section
(`Group`), and the rules a value must follow: `integer`, `number`, `one_of`, `boolean`, `text`, ...
A rule returns None when the value is allowed, else the text saying what is allowed
(`config_check.validate` turns it into one line naming the field). The declarations themselves
are `experiments.fields`.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# A rule returns None when the value is allowed, else the text saying what is allowed.
Rule = Callable[[Any], str | None]


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field, declared once: `base_config()` takes its default, `config_check.validate`
  its rule and `--help_config` its help."""

  default: Any
  rule: Rule
  help: str


@dataclasses.dataclass(frozen=True)
class Group:
  """A config section `config.<name>`: what it is for, and its fields in order."""

  help: str
  fields: Mapping[str, Field]


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
  return isinstance(x, int | float) and not isinstance(x, bool)


def integer(low: int = 1, *, none_ok: bool = False) -> Rule:
  """An int >= `low` (None too when `none_ok`)."""

  def rule(x):
    if none_ok and x is None:
      return None
    if _is_int(x) and x >= low:
      return None
    return f"need an int >= {low}" + (" or None" if none_ok else "")

  return rule


def number(low: float = 0.0, high: float | None = None, *, low_open=False, high_open=False) -> Rule:
  """A finite number in [low, high] (either end open when asked; `high` None = no bound)."""
  left = "(" if low_open else "["
  right = ")" if high_open else "]"
  if high is None:
    need = f"need a finite number {'>' if low_open else '>='} {low:g}"
  else:
    need = f"need a finite number in {left}{low:g}, {high:g}{right}"

  def rule(x):
    if not (_is_number(x) and math.isfinite(x)):
      return need
    if x < low or (low_open and x == low):
      return need
    if high is not None and (x > high or (high_open and x == high)):
      return need
    return None

  return rule


POSITIVE = number(0.0, low_open=True)
NON_NEGATIVE = number(0.0)
PROBABILITY = number(0.0, 1.0, low_open=True)  # top_p and the like: (0, 1]
FRACTION = number(0.0, 1.0, low_open=True, high_open=True)


def one_of(choices: Iterable[Any]) -> Rule:
  choices = tuple(choices)

  def rule(x):
    try:
      ok = x in choices
    except TypeError:  # unhashable
      ok = False
    return None if ok else f"use one of {choices}"

  return rule


def one_of_registry(path: str, *, extra: tuple = (), sort: bool = False) -> Rule:
  """One of the names of a library registry `"module:NAME"` (with `extra` first), imported when a
  value is checked: declaring the field imports no jax (the config files load before the flags are
  parsed)."""
  module, _, name = path.partition(":")

  def rule(x):
    names = getattr(importlib.import_module(module), name)
    return one_of((*extra, *(sorted(names) if sort else names)))(x)

  return rule


def boolean(x: Any) -> str | None:
  return None if isinstance(x, bool) else "need True or False"


def mapping(x: Any) -> str | None:
  return None if isinstance(x, Mapping) or hasattr(x, "keys") else "need a dict"


def text(*, empty_ok: bool = True) -> Rule:
  def rule(x):
    if isinstance(x, str) and (empty_ok or x):
      return None
    return "need a string" if empty_ok else "need a non-empty string"

  return rule


def int_sequence(low: int = 1) -> Rule:
  """A non-empty list/tuple of ints >= low."""

  def rule(x):
    ok = isinstance(x, list | tuple) and len(x) > 0 and all(_is_int(v) and v >= low for v in x)
    return None if ok else f"need a non-empty tuple of ints >= {low}"

  return rule


def number_sequence(inner: Rule, need: str) -> Rule:
  def rule(x):
    ok = isinstance(x, list | tuple) and len(x) > 0 and all(inner(v) is None for v in x)
    return None if ok else need

  return rule


def comma_list(choices: Iterable[str] | None = None, *, ints_from: int | None = None) -> Rule:
  """A comma-separated string of names from `choices`, or of ints >= `ints_from`."""
  choices = None if choices is None else tuple(choices)

  def rule(x):
    items = [s.strip() for s in x.split(",") if s.strip()] if isinstance(x, str) else []
    if choices is not None:
      ok = bool(items) and all(s in choices for s in items)
      return None if ok else f"need a comma-separated list of {choices}"
    ok = bool(items) and all(s.lstrip("-").isdigit() and int(s) >= ints_from for s in items)
    return None if ok else f"need comma-separated ints >= {ints_from}, e.g. '8,16,32'"

  return rule


def reward_or_task(*, empty_ok: bool) -> Rule:
  """A name `es_jax.rewards.get_reward` knows (a reward, a task, or reasoning_gym/<task>)."""

  def rule(x):
    rewards = importlib.import_module("es_jax.rewards")  # when checked: no jax at declaration
    if empty_ok and x == "":
      return None
    if isinstance(x, str) and (x.startswith("reasoning_gym/") or x in rewards.TASK_REWARDS):
      return None
    if isinstance(x, str) and rewards.is_user_reward(x) and x.rpartition(":")[2].isidentifier():
      return None  # imported (and its signature checked) when the run loads its data
    known = sorted(rewards.TASK_REWARDS)
    return (
      f"use a reward or task of es_jax.rewards ({known}), 'reasoning_gym/<task>', or your "
      "function as 'module:function' or 'path/to/file.py:function'"
    )

  return rule


def task_name(x: Any) -> str | None:
  """A task `es_jax.data.load_task` knows."""
  data = importlib.import_module("es_jax.data")  # when checked: no jax at declaration
  if isinstance(x, str) and (x.startswith("reasoning_gym/") and len(x) > 14 or x in data.TASKS):
    return None
  if x == data.FILE_TASK:
    return None
  return f"use one of {tuple(data.TASKS)}, 'reasoning_gym/<task>' or 'file' (your own file)"
