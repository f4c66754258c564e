"""The evaluation problems of a config, disjoint from its training set.

The training set of a config is its training pool: config.data's task, split, limit,
task_config and seed, loaded exactly as training loads it (`run_data.load_examples`). Prompts are
compared normalised (`es_jax.data.normalize_prompt`: case folded, whitespace collapsed). Every
evaluation a run makes (eval.task, each of eval.extra_tasks, the diversity measurement's problems)
loads its problems through a `Heldout`:

  - reasoning-gym tasks draw `limit` distinct problems outside the training prompts
    (`es_jax.data.draw_disjoint`); a task that cannot supply them is refused with one line naming
    the limit field (`eval.limit`, `eval.extra_tasks[i].limit`), before the model loads;
  - file and TFDS tasks have fixed rows: their overlap with the training prompts is measured and
    logged, more than zero warns, and eval.drop_seen=True drops those rows and repeated rows.

Each `TaskSpec` carries its count of problems seen in training (0 unless a fixed split overlaps
and drop_seen is off), stored with the problem counts in `<label>.meta.json` and the tables. For
method="evaluate" a training pool that cannot be loaded (a TFDS dataset never downloaded) leaves
the count unknown (None, with a warning) rather than refusing the evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections

from es_jax import data
from experiments import fields
from experiments.evaluation import results as eval_results
from experiments.evaluation.tasks import TaskSpec, eval_section, extra_task_sections
from experiments.runners import run_data
from experiments.schema import check as config_check

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Heldout:
  """What evaluation problems must avoid: the training pool's normalised prompts (`exclude`;
  None when the pool could not be loaded), and whether fixed rows seen there are dropped."""

  exclude: frozenset[str] | None
  drop_seen: bool = False

  def load(
    self,
    section: Mapping[str, Any],
    field: str,
    *,
    limit: int | None = None,
    options: Mapping[str, Any] | None = None,
  ) -> tuple[Sequence[dict], int | None]:
    """(the problems of `section` (config.eval or an extra task), how many are training prompts).

    Raises:
      ConfigError: naming `<field>.limit` when a generated task holds too few disjoint problems.
    """
    limit = section.get("limit") if limit is None else limit
    task = section.get("task") or ""
    if data.gym.is_gym_task(task) and self.exclude is not None:
      with config_check.user_errors(f"config.{field}"):
        try:
          examples = data.draw_disjoint(
            task,
            section.get("split") or "",
            limit=int(limit),
            seed=int(section.get("seed", fields.default("seed"))),
            task_config=dict(section.get("task_config") or {}) or None,
            exclude=self.exclude,
          )
        except data.TaskSpaceTooSmallError as e:
          raise config_check.fail(
            f"{field}.limit",
            limit,
            f"{e}: lower it, or widen {field}.task_config (or use another task)",
          ) from e
      return examples, 0
    examples = run_data.load_examples(section, field, limit=limit, options=options)
    if self.exclude is None:
      return examples, None
    counts = data.overlap(examples, self.exclude)
    log.info("%s (%s): %s", field, task, counts.describe())
    if counts.num_seen_in_training and not self.drop_seen:
      log.warning(
        "%s: %d of its %d problems are training prompts (config.data); set "
        "eval.drop_seen=True to drop them",
        field,
        counts.num_seen_in_training,
        counts.num_problems,
      )
      return examples, counts.num_seen_in_training
    if self.drop_seen and (counts.num_seen_in_training or counts.num_distinct < len(examples)):
      examples = data.drop_seen(examples, self.exclude)
      config_check.check(
        len(examples) > 0, "eval.drop_seen", True, f"{field} has no problem left: all seen"
      )
      log.info("%s: kept %d problems (eval.drop_seen)", field, len(examples))
    return examples, 0


def training_set(config: ml_collections.ConfigDict, examples=None) -> Heldout:
  """The `Heldout` of `config`: its training pool's prompts (`examples` if already loaded).

  For method="evaluate" a pool that cannot be loaded gives an unknown overlap (a warning)."""
  drop = bool(config.eval.drop_seen)
  if examples is None:
    section = {**config.data.to_dict(), "progress": False}
    options = run_data.file_options(config.data)
    try:
      examples = run_data.load_examples(section, "data", options=options)
    except (config_check.ConfigError, FileNotFoundError) as e:
      if config.method != "evaluate":
        raise
      log.warning("the training pool (config.data) did not load (%s): overlap unknown", e)
      return Heldout(None, drop)
  return Heldout(data.prompt_keys(examples), drop)


class EvalTasks(NamedTuple):
  """A config's evaluation tasks: eval.task's spec and eval.extra_tasks' specs."""

  main: TaskSpec
  extra: list[TaskSpec]


def load_eval_tasks(config: ml_collections.ConfigDict, heldout: Heldout | None = None) -> EvalTasks:
  """The evaluation tasks of `config`, each disjoint from `heldout` (default: `training_set`).

  Cheap for reasoning-gym tasks: runners call it before loading the model, so a config whose
  task cannot supply its problems is refused first.
  """
  heldout = training_set(config) if heldout is None else heldout
  section, task, label = eval_section(config)
  options = run_data.file_options(config.data)
  examples, seen = heldout.load(section, "eval", options=options)
  main = TaskSpec(label, task, examples, num_seen_in_training=seen)
  return EvalTasks(main, extra_eval_tasks(section, taken={label}, heldout=heldout))


def extra_eval_tasks(ev: Mapping[str, Any], *, taken: set[str], heldout: Heldout) -> list[TaskSpec]:
  """The TaskSpecs of `eval.extra_tasks` (`eval_tasks.extra_task_sections`), each disjoint from
  `heldout`; labels in `taken` are refused, and the new ones added to it."""
  specs = []
  for field, label, entry in extra_task_sections(ev, taken=taken):
    examples, seen = heldout.load(entry, field)
    spec = TaskSpec(label, entry["task"], examples, entry["average"], num_seen_in_training=seen)
    specs.append(spec)
  return specs


def problem_counts(task: TaskSpec) -> dict[str, Any]:
  """num_problems, num_distinct (normalised prompts) and num_seen_in_training (None: not
  measured) of a task, and "problems": a digest of its ids and prompts in order."""
  ids_prompts = [
    [eval_results.example_id(ex, i), data.normalize_prompt(ex["prompt"])]
    for i, ex in enumerate(task.examples)
  ]
  return {
    "num_problems": len(ids_prompts),
    "num_distinct": len({p for _, p in ids_prompts}),
    "num_seen_in_training": task.num_seen_in_training,
    "problems": hashlib.sha256(json.dumps(ids_prompts).encode()).hexdigest()[:16],
  }
