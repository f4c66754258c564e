"""What every stage of a run shares (`Context`, built once by `make_context`): the config, the
model, the data (experiments.run_data), the mesh (with the TPU memory check) and the held-out
`Evaluator` (periodic and final evaluation, through experiments.evaluate)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import checkpoint as checkpoint_lib
from es_jax import memory_plan, models, rewards, sampling
from es_jax import sharding as sharding_lib
from experiments import config_check, evaluate, model_io, run_data
from experiments.config_check import check, positive_int
from experiments.logger import (
  format_seconds,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Context:
  """What every stage of a run shares; built once by `make_context`."""

  config: ml_collections.ConfigDict
  workdir: str
  model_config: models.ModelConfig
  tokenizer: Any
  base_params: Any
  keys: dict[str, jax.Array]
  examples: Any  # the training pool
  score: Callable
  evaluator: Evaluator
  mesh: Any
  eos_ids: tuple[int, ...]
  pad_id: int
  data_sources: dict[str, Any] = dataclasses.field(default_factory=dict)  # in versions.json


def make_mesh(config: ml_collections.ConfigDict):
  pop = int(config.mesh.pop)
  check(pop >= 0, "mesh.pop", pop, "need 0 (all devices) or a positive int")
  return sharding_lib.make_mesh(pop or None, int(config.mesh.model))


def check_memory(
  config: ml_collections.ConfigDict,
  model_config: models.ModelConfig,
  mesh,
  *,
  devices: Sequence[Any] | None = None,
  prompt_len: int = memory_plan.PROMPT_LEN,
) -> None:
  """On TPU devices, raises ValueError when `config`'s programs are predicted not to fit.

  The chip comes from the first device's `device_kind` and its HBM from `memory_stats()` when the
  runtime reports it (else the published size, es_jax.memory_plan.CHIPS). The error names the
  config field to lower and the limit. Other platforms, and `mesh.check_memory=False`, skip it.
  """
  if not bool(config.mesh.get("check_memory", True)):
    return
  devices = list(devices if devices is not None else jax.devices())
  device = devices[0]
  if device.platform != "tpu":
    return
  chip = memory_plan.chip_for_device(device)
  if chip is None:
    log.warning("mesh.check_memory: unknown TPU %r, memory not checked", device.device_kind)
    return
  memory_plan.check_config_fits(
    config,
    model_config,
    chip,
    programs=memory_plan.METHOD_PROGRAMS[config.method],
    pop=int(mesh.shape["pop"]),
    model=int(mesh.shape["model"]),
    prompt_len=prompt_len,
  )


def make_context(config: ml_collections.ConfigDict, workdir: str) -> Context:
  """Loads the model, tokenizer, training pool and evaluation set that `config` names.

  Raises:
    ConfigError: a config value is invalid (`config_check.validate`), the workdir holds another
      method's run, or a file or the data cannot be loaded.
  """
  config_check.validate(config)
  config_check.check_workdir(config, workdir)
  mesh = make_mesh(config)
  t0 = time.perf_counter()
  with config_check.user_errors("config.model"):
    model, tokenizer = model_io.load_model(config.model, seed=config.seed)
  with config_check.user_errors("config.mesh.check_memory"):
    check_memory(config, model.config, mesh)
  n_params = sum(int(x.size) for x in jax.tree.leaves(models.params(model)))
  log.info(
    "model: %s (%.1fM parameters, %s) loaded in %s",
    model_io.model_label(config.model),
    n_params / 1e6,
    model.config.dtype,
    format_seconds(time.perf_counter() - t0),
  )
  keys = run_data.run_keys(config.seed)
  examples = run_data.load_examples(config.data, "data")
  with config_check.user_errors("config.data.reward"):
    reward = rewards.get_reward(run_data.reward_name(config.data))
  evaluator = Evaluator(config, tokenizer, keys)
  data_sources = {
    "data": run_data.examples_source(examples),
    "eval": run_data.examples_source(evaluator.examples),
  }
  for i, spec in enumerate(evaluator.extra):
    data_sources[f"eval.extra_tasks[{i}]"] = run_data.examples_source(spec.examples)
  log.info(
    "data: %d training examples of %s; evaluation: %d problems of %s%s",
    len(examples),
    config.data.task,
    len(evaluator.examples),
    config.eval.task,
    f" + {len(evaluator.extra)} more tasks" if evaluator.extra else "",
  )
  return Context(
    config=config,
    workdir=os.fspath(workdir),
    model_config=model.config,
    tokenizer=tokenizer,
    base_params=models.params(model),
    keys=keys,
    examples=examples,
    score=run_data.make_scorer(tokenizer, reward),
    evaluator=evaluator,
    mesh=mesh,
    eos_ids=run_data.eos_ids(tokenizer),
    pad_id=sampling.pad_id(tokenizer),
    data_sources=data_sources,
  )


class Evaluator:
  """Held-out evaluation of params: periodic (small slice, in memory) and final (files)."""

  def __init__(self, config: ml_collections.ConfigDict, tokenizer, keys: Mapping[str, jax.Array]):
    ev = config.eval
    for name in (
      "limit",
      "num_samples",
      "max_new_tokens",
      "batch_size",
      "periodic_limit",
      "periodic_num_samples",
    ):
      positive_int(ev[name], f"eval.{name}")
    check(isinstance(ev.every, int) and ev.every >= 0, "eval.every", ev.every, "need an int >= 0")
    self.config, self.tokenizer, self.key = ev, tokenizer, keys["eval"]
    self.examples = run_data.load_examples(ev, "eval")
    self.task = ev.task
    self.label = task_label(ev.task)
    # The final evaluation also covers eval.extra_tasks (loaded now, so bad entries fail before
    # training): held-out tasks for forgetting, or several benchmarks averaged (macro).
    self.extra = extra_eval_tasks(ev, taken={self.label})

  def _kwargs(self, num_samples: int) -> dict[str, Any]:
    ev = self.config
    return dict(
      num_samples=num_samples,
      temperature=float(ev.temperature),
      top_p=float(ev.top_p),
      max_new_tokens=int(ev.max_new_tokens),
      batch_size=int(ev.batch_size),
      ks=tuple(k for k in ev.ks if k <= num_samples) or (1,),
      key=self.key,
      progress=False,
    )

  def due(self, step: int, num_steps: int) -> bool:
    """A periodic evaluation after `step` local steps (not at the end: the final one covers it)."""
    return self.config.every > 0 and step % self.config.every == 0 and step < num_steps

  def periodic(self, params, model_config: models.ModelConfig) -> dict[str, float]:
    """Greedy and Pass@k on the first `periodic_limit` problems, as metrics "eval/...".

    The same problems and keys every time, so the numbers are comparable across steps.
    """
    n = int(self.config.periodic_num_samples)
    count = min(self.config.periodic_limit, len(self.examples))
    examples = [self.examples[i] for i in range(count)]
    summary = evaluate.evaluate_model(
      models.cast_params(params, model_config.jnp_dtype),  # masters sample in compute dtype
      model_config,
      self.tokenizer,
      examples,
      task=self.task,
      label=self.label,
      **self._kwargs(n),
    )
    return flat_summary(summary, prefix="eval/")

  def final(
    self, params, model_config: models.ModelConfig, out_dir: str, run_info=None
  ) -> dict[str, Any]:
    """The full evaluation written into `out_dir` (resumable, see experiments.evaluate);
    `run_info` (e.g. the model config) is stored with the settings: a resume must match it.

    Raises:
      evaluate.EvaluationStopped: the run's SIGTERM flag was set before a batch.
    """
    n = int(self.config.num_samples)
    batches = iter(range(1, 1 << 62))

    def should_stop() -> bool:
      checkpoint_lib.sigterm_point(f"eval:{next(batches)}")
      return preempted()

    return evaluate.evaluate_tasks(
      models.cast_params(params, model_config.jnp_dtype),
      model_config,
      self.tokenizer,
      [evaluate.TaskSpec(self.label, self.task, self.examples), *self.extra],
      out_dir=out_dir,
      log_progress=True,
      run_info=run_info,
      should_stop=should_stop,
      **self._kwargs(n),
    )


def task_label(task: str) -> str:
  """A task's label in evaluation files and tables (its name, "/" replaced)."""
  return task.replace("/", "_")


EXTRA_TASK_FIELDS = (
  "task",
  "split",
  "limit",
  "task_config",
  "data_dir",
  "source_dir",
  "on_bad_row",
  "label",
)


def extra_eval_tasks(ev: Mapping[str, Any], *, taken: set[str]) -> list[evaluate.TaskSpec]:
  """The TaskSpecs of `eval.extra_tasks`: each entry a task name, or a dict with "task" and any
  of split, limit, data_dir, on_bad_row (default: eval's), task_config, source_dir, label
  (default: none / the task name). Errors name the entry, e.g. `eval.extra_tasks[1].task`."""
  entries = ev.get("extra_tasks") or ()
  check(
    isinstance(entries, (list, tuple)),
    "eval.extra_tasks",
    entries,
    "give a list of task names or {task, split, limit, ...} dicts",
  )
  specs = []
  for i, entry in enumerate(entries):
    field = f"eval.extra_tasks[{i}]"
    entry = {"task": entry} if isinstance(entry, str) else entry
    check(isinstance(entry, Mapping), field, entry, "give a task name or a dict with 'task'")
    entry = dict(entry)
    unknown = sorted(set(entry) - set(EXTRA_TASK_FIELDS))
    check(not unknown, field, entry, f"unknown keys {unknown}; use {list(EXTRA_TASK_FIELDS)}")
    section = {
      "split": ev.get("split"),
      "limit": ev.get("limit"),
      "data_dir": ev.get("data_dir"),
      "on_bad_row": ev.get("on_bad_row"),
      **entry,
    }
    task = section.get("task")
    check(isinstance(task, str) and bool(task), f"{field}.task", task, "name the task")
    label = section.get("label") or task_label(task)
    check(
      label not in taken,
      f"{field}.label",
      label,
      "labels must be unique (the main eval task's included): set 'label'",
    )
    taken.add(label)
    specs.append(evaluate.TaskSpec(label, task, run_data.load_examples(section, field)))
  return specs


def flat_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """The scalar entries of an evaluation summary (greedy, pass@k, maj@k, length, entropy)."""
  out = {}
  for name, value in summary.items():
    if isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool):
      out[prefix + name] = float(value)
  return out


def preempted() -> bool:
  """Whether the run's SIGTERM flag (`es_jax.checkpoint.sigterm_scope`) is set, on any host.

  False outside a scope. A collective with several processes: call it at the same point on all.
  """
  handler = checkpoint_lib.active_handler()
  return handler is not None and handler.should_stop()
