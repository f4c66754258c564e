"""Validation of an experiment config before anything is loaded: every field's type and range.

`validate(config)` walks `schema()` (dotted field -> rule) and raises `ConfigError` with one line
naming the full dotted field, its value and what is allowed, e.g.

    config.eval.temperature=nan is invalid: need a finite number >= 0.

Rules that involve several fields live in `experiments.config_rules`. The allowed names come
from the config layer (`experiments.configs.choices`, `base.METHODS`) and the library's registries
(shapings, rewards, presets, ...), so a new shaping or reward is accepted without touching this
module; no runner is imported here (the runners import this module). The errors and the
single-value checks (`ConfigError`, `check`, ...) live in `experiments.config_errors`.
`check_workdir(config, workdir)` refuses to resume a workdir whose saved config.json names
another method. `unknown_key_message` turns an unknown `--config.a.b` override into one line with
close matches. `--help_config`'s listing of every field is `experiments.config_docs`.
A config still setting `es.precision` (split into `es.master_dtype` and `es.arithmetic`) is
refused with the translation of its value (`es_precision_message`); `split_es_precision` reads a
checkpoint's config from before the split.

`main` and the runners' `run` call `validate`, so library callers get the same checks.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.config_errors import ConfigError, fail
from experiments.config_errors import check as check  # re-exported: the runners' checks
from experiments.config_errors import positive_finite as positive_finite
from experiments.config_errors import positive_int as positive_int
from experiments.config_errors import user_errors as user_errors
from experiments.config_values import (
  FRACTION,
  NON_NEGATIVE,
  POSITIVE,
  PROBABILITY,
  Rule,
  boolean,
  comma_list,
  int_sequence,
  integer,
  mapping,
  number,
  number_sequence,
  one_of,
  reward_or_task,
  task_name,
  text,
)

TRAINING = ("es", "grpo", "sequential")  # the methods whose checkpoints a workdir resumes


@functools.cache
def schema() -> dict[str, Rule]:
  """Dotted field -> rule, for every field of `experiments.configs.base.base_config`."""
  # Imported here: es_jax brings jax, which `main` imports only once the flags are parsed.
  from experiments.configs import base, choices

  return {
    "method": one_of(base.METHODS),
    "seed": integer(0),
    **_model_data_rules(choices),
    **_eval_rules(),
    **_es_rules(choices),
    **_grpo_rules(choices),
    "checkpoint.every": integer(1),
    "checkpoint.keep": integer(1),
    "checkpoint.async_save": boolean,
    "export_hf": boolean,
    "max_update_ratio": NON_NEGATIVE,
    "mesh.pop": integer(0),
    "mesh.model": integer(1),
    "mesh.check_memory": boolean,
    "decode.kv_chunk": integer(0),
    "decode.compactions": integer(0),
    "progress": boolean,
    "log_samples_every": integer(0),
    "log_samples": integer(0),
    **_study_rules(choices),
  }


def _model_data_rules(choices) -> dict[str, Rule]:
  from es_jax import models

  return {
    "model.source": one_of((*choices.MODEL_SOURCES, "random")),
    "model.path": text(),
    "model.base_source": one_of(s for s in choices.MODEL_SOURCES if s != "orbax"),
    "model.base_path": text(),
    "model.preset": one_of(("", *sorted(models.PRESETS))),
    "model.dtype": one_of(choices.MODEL_DTYPES),
    "data.task": task_name,
    "data.path": text(),
    "data.question_field": text(empty_ok=False),
    "data.answer_field": text(empty_ok=False),
    "data.prompt_template": text(),
    "data.split": text(empty_ok=False),
    "data.limit": integer(1, none_ok=True),
    "data.task_config": mapping,
    "data.data_dir": text(),
    "data.source_dir": text(),
    "data.reward": reward_or_task(empty_ok=True),
    "data.reward_timeout": number(0.0, low_open=True),
    "data.prompts_per_step": integer(1),
    "data.shuffle": boolean,
  }


def _eval_rules() -> dict[str, Rule]:
  return {
    "eval.task": task_name,
    "eval.path": text(),
    "eval.split": text(empty_ok=False),
    "eval.limit": integer(1),
    "eval.task_config": mapping,
    "eval.data_dir": text(),
    "eval.source_dir": text(),
    "eval.drop_seen": boolean,
    "eval.num_samples": integer(1),
    "eval.temperature": NON_NEGATIVE,
    "eval.top_p": PROBABILITY,
    "eval.max_new_tokens": integer(1),
    "eval.batch_size": integer(1),
    "eval.refill": boolean,
    "eval.ks": int_sequence(1),
    "eval.every": integer(0),
    "eval.periodic_limit": integer(1),
    "eval.periodic_num_samples": integer(1),
    "eval.final": boolean,
    "eval.restart": boolean,
    "eval.keep_samples": integer(0),
    "eval.extra_tasks": lambda x: None if isinstance(x, list | tuple) else "need a list",
  }


def _es_rules(choices) -> dict[str, Rule]:
  from es_jax import fitness

  return {
    "es.num_steps": integer(1),
    "es.population_size": integer(1),
    "es.sigma": POSITIVE,
    "es.learning_rate": POSITIVE,
    "es.optimizer": one_of(choices.ES_OPTIMIZERS),
    "es.shaping": one_of(sorted(fitness.SHAPINGS)),
    "es.antithetic": boolean,
    "es.share_sample_key": boolean,
    "es.rank": integer(0),
    "es.low_rank_vectors": one_of(choices.ES_LOW_RANK_VECTORS),
    "es.master_dtype": one_of(choices.MASTER_DTYPES),
    "es.arithmetic": one_of(choices.ES_ARITHMETICS),
    "es.members_per_chunk": integer(1),
    "es.max_new_tokens": integer(1),
    "es.temperature": NON_NEGATIVE,
    "es.top_p": PROBABILITY,
  }


def _grpo_rules(choices) -> dict[str, Rule]:
  from es_jax import grpo as grpo_lib

  return {
    "grpo.num_steps": integer(1),
    "grpo.num_generations": integer(2),
    "grpo.learning_rate": POSITIVE,
    "grpo.weight_decay": NON_NEGATIVE,
    "grpo.max_grad_norm": POSITIVE,
    "grpo.master_dtype": one_of(choices.MASTER_DTYPES),
    "grpo.remat": boolean,
    "grpo.beta": NON_NEGATIVE,
    "grpo.eps_low": NON_NEGATIVE,
    "grpo.eps_high": NON_NEGATIVE,
    "grpo.aggregation": one_of(grpo_lib.AGGREGATIONS),
    "grpo.advantage_std": one_of(tuple(choices.GRPO_ADVANTAGE_STD)),
    "grpo.mini_batch_size": integer(0),
    "grpo.micro_batch_size": integer(1),
    "grpo.max_new_tokens": integer(1),
    "grpo.temperature": POSITIVE,
    "grpo.top_p": PROBABILITY,
    "sequential.order": one_of(tuple(choices.SEQUENTIAL_ORDERS)),
    "sequential.kl_reference": one_of(choices.SEQUENTIAL_KL_REFERENCES),
    "sequential.total_steps": integer(2),
    "sequential.first_fraction": FRACTION,
  }


def _study_rules(choices) -> dict[str, Rule]:
  """The fields of the methods other than training: demo, sweeps, sparsity, diversity, fair."""
  from es_jax import metrics

  positives = number_sequence(POSITIVE, "need a non-empty tuple of numbers > 0")
  return {
    "demo.runs": comma_list(tuple(choices.DEMO_RUNS)),
    "population_sweep.sizes": comma_list(ints_from=2),
    "population_sweep.ema_decay": number(0.0, 1.0, high_open=True),
    "population_sweep.tolerance": NON_NEGATIVE,
    "population_sweep.evaluate": boolean,
    "sparsity.tuned": text(),
    "sparsity.taus": number_sequence(POSITIVE, "need a non-empty tuple of finite numbers > 0"),
    "sparsity.top_fraction": PROBABILITY,
    "diversity.run": text(),
    "diversity.step": integer(-1),
    "diversity.key_step": integer(-1),
    "diversity.population_size": integer(0),
    "diversity.sigma": NON_NEGATIVE,
    "diversity.num_samples": integer(1),
    "diversity.temperature": POSITIVE,
    "diversity.limit": integer(1),
    "diversity.prompts_per_call": integer(1),
    "diversity.pol_prompts": integer(1),
    "diversity.pol_samples": integer(1),
    "diversity.bootstrap": integer(1),
    "diversity.correction": one_of(metrics.JS_CORRECTIONS),
    "diversity.kinds": comma_list(tuple(choices.DIVERSITY_KINDS)),
    "diversity.checkpoints": boolean,
    "diversity.sigmas": positives,
    "diversity.min_changed": PROBABILITY,
    "diversity.fitness_tolerance": NON_NEGATIVE,
    "diversity.extensions": integer(0),
    "diversity.restart": boolean,
    "fair.calibrate": boolean,
    "fair.alpha_ratios": positives,
    "fair.grpo_lrs": positives,
    "fair.pilot_steps": integer(1),
    "fair.diversity": boolean,
    "fair.redo": lambda x: None if x == "" else comma_list(choices.FAIR_STAGES)(x),
    "fair.design": one_of((1, 2)),
    "fair.extensions": integer(0),
    "fair.sampled_temperature": POSITIVE,
    "fair.second_seed": integer(0),
    "fair.extend_steps": integer(1),
    "fair.preregistration": text(),
  }


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


def validate(config: Any) -> Any:
  """Checks every field of `schema()` present in `config`, then the cross-field rules.

  Args:
    config: a ConfigDict (or nested mapping) built from `base_config()`.

  Returns:
    `config`, unchanged.

  Raises:
    ConfigError: one line naming the dotted field, the value and what is allowed.
  """
  if (old := _get(config, "es.precision")) is not _MISSING:
    raise ConfigError(es_precision_message(old))
  for field, rule in schema().items():
    value = _get(config, field)
    if value is _MISSING:
      continue
    need = rule(value)
    if need is not None:
      raise fail(field, value, need)
  if all(_get(config, s) is not _MISSING for s in ("es", "grpo", "model", "data")):
    from experiments import config_rules  # here: it imports es_jax (jax), see schema()

    config_rules.cross_checks(config)
  return config


def validate_section(section: Any, name: str) -> Any:
  """Checks the fields of one config section (`config.<name>`) with `schema()`'s rules, for the
  entry points that take a section without a validated config (`es_runner.make_update_rule`,
  the TPU programs); the cross-field rules need the whole config (`validate`).

  Raises:
    ConfigError: one line naming `config.<name>.<field>`, the value and what is allowed.
  """
  validate({name: section})
  return section


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
  config.method reads (`experiments.configs.base.METHOD_GROUPS`; all for an unknown method)."""
  from experiments.configs.base import METHOD_GROUPS

  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  used = METHOD_GROUPS.get(d.get("method"))
  if used is not None and d.get("method") == "evaluate" and d.get("eval", {}).get("task") == "file":
    used = (*used, "data")
  top = [f"{k}={v!r}" for k, v in d.items() if not isinstance(v, Mapping)]
  lines = ["config: " + " ".join(top)]
  for k, v in d.items():
    if isinstance(v, Mapping) and (used is None or k in used):
      lines.append(f"  {k}: " + " ".join(f"{kk}={vv!r}" for kk, vv in v.items()))
  return "\n".join(lines)
