"""Validation of an experiment config before anything is loaded: every field's rule, then the
rules across fields.

`validate(config)` checks each field with the rule of its declaration (`experiments.fields`), then
`experiments.schema.rules.cross_checks`, and raises `ConfigError` with one line naming the full
dotted field, its value and what is allowed, e.g.

    config.eval.temperature=nan is invalid: need a finite number >= 0.

A config is validated once per run: by `experiments.main` before it calls the method's runner, and
by each runner's `run(config, workdir)` (`experiments.fields.METHODS`), the public entry a test or
a library user calls; a config that passed is remembered by its content, so the runner's call
after main's, or a nested runner's on the same config, costs nothing. Everything below a runner's
`run` trusts the config and checks only what is known at run time (file contents, model shapes,
devices). No runner is imported here (the runners import this module). The errors and the
single-value checks (`ConfigError`, `check`, ...) live in `experiments.schema.errors`.
`check_workdir(config, workdir)` refuses to resume a workdir whose saved config.json names
another method. `unknown_key_message` turns an unknown `--config.a.b` override into one line with
close matches. `--help_config`'s listing of every field is `experiments.schema.docs`.
A config still setting `es.precision` (split into `es.master_dtype` and `es.arithmetic`) is
refused with the translation of its value (`es_precision_message`); `split_es_precision` reads a
checkpoint's config from before the split.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import fields
from experiments.schema import rules as config_rules
from experiments.schema.errors import ConfigError, fail
from experiments.schema.errors import check as check  # re-exported: the runners' checks
from experiments.schema.errors import positive_int as positive_int
from experiments.schema.errors import user_errors as user_errors
from experiments.schema.values import Rule

TRAINING = ("es", "grpo", "sequential")  # the methods whose checkpoints a workdir resumes


def schema() -> dict[str, Rule]:
  """Dotted field -> its declared rule, for every field of `base_config()`."""
  return {name: f.rule for name, f in fields.declared().items()}


_MISSING = object()

# es.precision (until it was split in two): each old value -> (es.master_dtype, es.arithmetic).
ES_PRECISION_SPLIT = {
  "fp32": ("float32", "fp32"),
  "bf16": ("", "fp32"),
  "bf16_faithful": ("", "bf16_faithful"),
  "bf16_shared_noise": ("", "bf16_shared_noise"),
  "bf16_tensor_noise": ("", "bf16_tensor_noise"),
}


def es_precision_message(value: Any = _MISSING) -> str:
  """One line for a config that still sets es.precision: the two fields it became, and how to
  write `value` (every old value when not given) with them."""
  name = "config.es.precision" + ("" if value is _MISSING else f"={value!r}")
  fix = ""
  if isinstance(value, str) and value in ES_PRECISION_SPLIT:
    master, arithmetic = ES_PRECISION_SPLIT[value]
    fix = f" For {value!r} set es.master_dtype={master!r}, es.arithmetic={arithmetic!r}."
  table = "; ".join(f"{old!r} -> {m!r}, {a!r}" for old, (m, a) in ES_PRECISION_SPLIT.items())
  return (
    f"{name} is no longer a field: it was split into es.master_dtype (the dtype ES keeps the "
    f"weights in: 'float32' or '' = the model's) and es.arithmetic (how a member θ + σε is "
    f"formed).{fix} Old value -> master_dtype, arithmetic: {table}."
  )


def split_es_precision(config: Mapping[str, Any]) -> dict[str, Any]:
  """A saved config dict (a checkpoint's trajectory config) from before es.precision was split,
  written with es.master_dtype and es.arithmetic; any other dict is returned as it is."""
  es = config.get("es")
  if not isinstance(es, Mapping) or es.get("precision") not in ES_PRECISION_SPLIT:
    return dict(config)
  es = dict(es)
  es["master_dtype"], es["arithmetic"] = ES_PRECISION_SPLIT[es.pop("precision")]
  return {**config, "es": es}


def _get(config: Any, dotted: str) -> Any:
  node = config
  for part in dotted.split("."):
    if not isinstance(node, Mapping) and not hasattr(node, "keys"):
      return _MISSING
    if part not in node:
      return _MISSING
    node = node[part]
  return node


# The configs that passed `validate`, by content: a run's later calls do not check them again.
_PASSED: set[str] = set()


def validate(config: Any) -> Any:
  """Checks every declared field present in `config` with its rule, then the cross-field rules;
  a config with the content of one that passed is not checked again.

  Args:
    config: a ConfigDict (or nested mapping) built from `base_config()`.

  Returns:
    `config`, unchanged.

  Raises:
    ConfigError: one line naming the dotted field, the value and what is allowed.
  """
  content = repr(config.to_dict() if hasattr(config, "to_dict") else config)
  if content in _PASSED:
    return config
  if (old := _get(config, "es.precision")) is not _MISSING:
    raise ConfigError(es_precision_message(old))
  for field, declared in fields.declared().items():
    value = _get(config, field)
    if value is _MISSING:
      continue
    need = declared.rule(value)
    if need is not None:
      raise fail(field, value, need)
  config_rules.cross_checks(config)
  _PASSED.add(content)
  return config


def check_workdir(config: Any, workdir: str) -> None:
  """Refuses to resume a workdir whose checkpoints were written by another method.

  Raises:
    ConfigError: workdir/config.json names another `method` and the workdir holds checkpoints.
  """
  path = os.path.join(os.fspath(workdir), "config.json")
  if "://" in path or not os.path.exists(path):
    return
  try:
    with open(path) as f:
      saved = json.load(f).get("method")
  except (OSError, ValueError, AttributeError):
    return
  if saved == config.method or saved not in TRAINING or config.method not in TRAINING:
    return
  if any("checkpoints" in dirs for _, dirs, _ in os.walk(workdir)):
    raise ConfigError(
      f"{workdir} holds a method={saved!r} run but config.method={config.method!r}: resume with "
      f"--config.method={saved}, or use a new workdir."
    )


def close_matches(name: str, known: Sequence[str]) -> list[str]:
  return difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)


def all_fields(config: Any, prefix: str = "") -> list[str]:
  """The dotted names of every leaf and section of a (nested) config."""
  out = []
  for k in config.keys():
    out.append(prefix + k)
    v = config[k]
    if hasattr(v, "keys") and not isinstance(v, str):
      out += all_fields(v, f"{prefix}{k}.")
  return out


def unknown_key_message(config: Any, dotted: str) -> str:
  """One line for an override of a key the config does not have, with close matches."""
  if dotted == "es.precision":
    return es_precision_message()
  fields = all_fields(config)
  parent, _, leaf = dotted.rpartition(".")
  siblings = [
    f for f in fields if f.rpartition(".")[0] == parent and "." not in f[len(parent) + 1 :]
  ]
  leaves = {f.rpartition(".")[2]: f for f in siblings}
  hint = [leaves[m] for m in close_matches(leaf, list(leaves))]  # same section first
  hint += [f for f in close_matches(dotted, fields) if f not in hint]
  if hint:
    return f"config.{dotted} is not a config field; did you mean {', '.join(hint[:3])}?"
  if siblings and parent:
    return f"config.{dotted} is not a config field; config.{parent} has {', '.join(leaves)}."
  return f"config.{dotted} is not a config field."


def compact(config: Any) -> str:
  """The resolved config on a few lines: the top-level fields, then one line per section that
  config.method reads (`experiments.fields.METHOD_GROUPS`; all for an unknown method)."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  used = fields.METHOD_GROUPS.get(d.get("method"))
  if used is not None and d.get("method") == "evaluate" and d.get("eval", {}).get("task") == "file":
    used = (*used, "data")
  top = [f"{k}={v!r}" for k, v in d.items() if not isinstance(v, Mapping)]
  lines = ["config: " + " ".join(top)]
  for k, v in d.items():
    if isinstance(v, Mapping) and (used is None or k in used):
      lines.append(f"  {k}: " + " ".join(f"{kk}={vv!r}" for kk, vv in v.items()))
  return "\n".join(lines)
