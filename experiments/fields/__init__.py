"""Every config field, declared once: its default, the rule its value must follow and its help.

Each field is a `Field(default, rule, help)` in the module of its group (`run`: the method, seed,
model, data, checkpoint, mesh and decode; `evaluation`: eval; `training`: es, grpo, sequential;
`studies`: demo, population_sweep, sparsity, diversity, fair, report). `LAYOUT` orders the
top-level fields and groups of the config. From these alone

  - `experiments.configs.base.base_config()` builds the ConfigDict (`defaults()`),
  - `experiments.schema.check.validate` checks every field with its rule (`declared()`),
  - `--help_config` prints each field's help (`experiments.schema.docs`).

Adding a field is one line in its group; adding a group is a `Group` in its module and its line
in `LAYOUT`. Rules that involve several fields live in `experiments.schema.rules`.
"""

from __future__ import annotations

import copy
import functools

import ml_collections

from experiments.fields import evaluation, run, studies, training
from experiments.schema.values import Field, Group

METHODS = run.METHODS
METHOD_GROUPS = run.METHOD_GROUPS

# The config, top to bottom: a top-level field or a group (`config.<name>.<field>`).
LAYOUT: dict[str, Field | Group] = {
  "method": run.METHOD,
  "seed": run.SEED,
  "model": run.MODEL,
  "data": run.DATA,
  "eval": evaluation.EVAL,
  "es": training.ES,
  "grpo": training.GRPO,
  "sequential": training.SEQUENTIAL,
  "checkpoint": run.CHECKPOINT,
  "export_hf": run.EXPORT_HF,
  "max_update_ratio": run.MAX_UPDATE_RATIO,
  "mesh": run.MESH,
  "decode": run.DECODE,
  "progress": run.PROGRESS,
  "log_samples_every": run.LOG_SAMPLES_EVERY,
  "log_samples": run.LOG_SAMPLES,
  "demo": studies.DEMO,
  "population_sweep": studies.POPULATION_SWEEP,
  "sparsity": studies.SPARSITY,
  "diversity": studies.DIVERSITY,
  "fair": studies.FAIR,
  "report": studies.REPORT,
}


@functools.cache
def declared() -> dict[str, Field]:
  """Dotted name -> `Field`, for every field of the config (`"seed"`, `"es.sigma"`, ...)."""
  out = {}
  for name, item in LAYOUT.items():
    if isinstance(item, Group):
      out.update({f"{name}.{leaf}": f for leaf, f in item.fields.items()})
    else:
      out[name] = item
  return out


def default(name: str):
  """The declared default of field `name` (e.g. "es.arithmetic"), for reading a saved config
  written before the field existed."""
  return copy.deepcopy(declared()[name].default)


def groups() -> dict[str, Group]:
  """Group name -> `Group`."""
  return {name: item for name, item in LAYOUT.items() if isinstance(item, Group)}


def defaults() -> ml_collections.ConfigDict:
  """A new, unlocked ConfigDict of every field at its default (mutable defaults copied)."""
  c = ml_collections.ConfigDict()
  for name, item in LAYOUT.items():
    if isinstance(item, Group):
      c[name] = {leaf: copy.deepcopy(f.default) for leaf, f in item.fields.items()}
    else:
      c[name] = copy.deepcopy(item.default)
  return c
