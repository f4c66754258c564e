"""What the ES, GRPO and sequential runners share: model and data loading, the data order, scoring,
evaluation during and after training, checkpoint/log plumbing, HF export and plots.

Keys. `run_keys(seed)` splits `jax.random.key(seed)` into named streams, so no two uses share a
key: `noise` (ES step keys, `fold_in(noise, global_step)`), `sample` (sampled decoding in ES and
GRPO rollouts, `fold_in(sample, global_step)`), `eval` (every evaluation) and `init` (random
models). Steps are global (a sequential run counts across stages), so each step's randomness
depends on nothing but the seed and the step.

Data order. Step s (global) uses examples `order[s·P .. s·P + P)` of an endless stream made of
one permutation of the pool per epoch (a fixed function of seed and epoch; the file order when
shuffle is off). The data position of a checkpoint is therefore its step times P; nothing else
needs saving. A sequential run's second stage continues the stream where the first stopped
(docs/method.md §4 does not say; this choice reuses no prompt before an epoch ends).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath
from flax import nnx

from es_jax import checkpoint as checkpoint_lib
from es_jax import data, memory_plan, metrics, models, rewards, sampling
from es_jax import sharding as sharding_lib
from es_jax.checkpoint import Checkpointer, install_sigterm_handler
from es_jax.models import gguf_loader
from experiments import config_check, evaluate, plots
from experiments.config_check import ConfigError
from experiments.logger import (
  ProgressBar,
  RunLogger,
  StepTimer,
  format_seconds,
  read_metrics,
  write_run_files,
)

log = logging.getLogger(__name__)
KEY_STREAMS = ("noise", "sample", "eval", "init")


def check(cond: bool, field: str, value: Any, need: str) -> None:
  """Raises ConfigError (a ValueError) naming the config field when `cond` is false."""
  if not cond:
    raise config_check.fail(field, value, need)


def positive_int(value: Any, field: str) -> int:
  check(
    isinstance(value, int) and not isinstance(value, bool) and value >= 1,
    field,
    value,
    "need an int >= 1",
  )
  return int(value)


def run_keys(seed: int) -> dict[str, jax.Array]:
  """The named key streams of a run (module docstring)."""
  keys = jax.random.split(jax.random.key(int(seed)), len(KEY_STREAMS))
  return dict(zip(KEY_STREAMS, keys, strict=True))


# --- model ---


def load_model(model_config: Mapping[str, Any], *, seed: int = 0):
  """(Transformer, tokenizer) for config.model.

  Sources: those of `experiments.evaluate.load_model` (default, hf, gguf, orbax) plus "random":
  the preset `model.preset` (e.g. "tiny-llama") with random weights from the run's `init` key and
  its vocabulary widened to the bundled SmolLM2 tokenizer's, for smoke runs and tests.
  """
  if model_config.get("source") != "random":
    return evaluate.load_model(model_config)
  preset = model_config.get("preset") or ""
  check(preset in models.PRESETS, "model.preset", preset, f"use one of {sorted(models.PRESETS)}")
  tokenizer = gguf_loader.default_tokenizer()
  cfg = dataclasses.replace(models.get_config(preset), vocab_size=len(tokenizer))
  dtype = model_config.get("dtype") or ""
  check(dtype in evaluate.MODEL_DTYPES, "model.dtype", dtype, f"use one of {evaluate.MODEL_DTYPES}")
  cfg = cfg.replace(dtype=dtype or cfg.dtype)
  seed_int = int(jax.random.randint(run_keys(seed)["init"], (), 0, 2**31 - 1))
  return models.Transformer(cfg, rngs=nnx.Rngs(seed_int)), tokenizer


def export_hf(params, model_config: models.ModelConfig, tokenizer, path: str) -> str:
  """Writes params as an HF directory (config.json, safetensors, tokenizer) that transformers
  and vLLM load; returns the path."""
  models.save_hf(models.from_params(model_config, params), tokenizer, path)
  return path


# --- data ---


def _task_kwargs(section: Mapping[str, Any], field: str) -> dict[str, Any]:
  task = section.get("task") or ""
  check(bool(task), f"{field}.task", task, "name a task (es_jax.data.TASKS or reasoning_gym/...)")
  task_config = dict(section.get("task_config") or {}) or None
  return dict(
    name=task,
    task_config=task_config,
    data_dir=section.get("data_dir") or None,
    source_dir=section.get("source_dir") or None,
    on_bad_row=section.get("on_bad_row") or "raise",
  )


def load_examples(section: Mapping[str, Any], field: str, *, limit: int | None = None):
  """The examples of config.data or config.eval (`field` names the section in errors)."""
  kwargs = _task_kwargs(section, field)
  split = section.get("split") or ""
  check(bool(split), f"{field}.split", split, "name a split")
  limit = section.get("limit") if limit is None else limit
  with config_check.user_errors(f"config.{field}"):
    examples = data.load_task(split=split, limit=limit, **kwargs)
  check(len(examples) > 0, f"{field}.limit", limit, f"the task {kwargs['name']!r} gave no example")
  return examples


def reward_name(section: Mapping[str, Any]) -> str:
  return section.get("reward") or section.get("task")


def batch_indices(num_examples: int, *, step: int, batch: int, seed: int, shuffle: bool):
  """Indices into the pool of the `batch` examples of global step `step` (module docstring)."""
  positions = np.arange(step * batch, (step + 1) * batch, dtype=np.int64)
  epochs, within = np.divmod(positions, num_examples)
  out = np.empty(batch, np.int64)
  for epoch in np.unique(epochs):
    if shuffle:
      order = np.random.default_rng([int(seed), int(epoch)]).permutation(num_examples)
    else:
      order = np.arange(num_examples)
    sel = epochs == epoch
    out[sel] = order[within[sel]]
  return out


def encode_examples(tokenizer, examples: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
  """Chat-formatted, tokenised, left-padded prompts [P, S] (bucketed lengths)."""
  texts = [data.format_prompt(ex, tokenizer) for ex in examples]
  return sampling.encode_prompts(tokenizer, texts)


def eos_ids(tokenizer) -> tuple[int, ...]:
  ids = {tokenizer.eos_token_id}
  return tuple(sorted(i for i in ids if i is not None))


def positive_finite(value: Any, field: str) -> float:
  """`value` as a float, or ValueError naming `field` unless it is a finite number > 0."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  check(ok and math.isfinite(value) and value > 0, field, value, "need a finite number > 0")
  return float(value)


def pad_id(tokenizer) -> int:
  return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)


def make_scorer(
  tokenizer, reward: Callable[[str, dict], float]
) -> Callable[[np.ndarray, np.ndarray, Sequence[dict]], np.ndarray]:
  """`score(tokens [R, T], mask [R, T], examples [R]) -> rewards [R]` on decoded completions.

  Rewards come from es_jax.rewards (no model output is executed in-process).
  """

  def score(tokens, mask, examples):
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    out = np.empty(len(examples), np.float32)
    for r, ex in enumerate(examples):
      text = tokenizer.decode(tokens[r][mask[r]], skip_special_tokens=True)
      out[r] = reward(text, ex)
    return out

  return score


# --- evaluation ---


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
    self.examples = load_examples(ev, "eval")
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
    specs.append(evaluate.TaskSpec(label, task, load_examples(section, field)))
  return specs


def flat_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """The scalar entries of an evaluation summary (greedy, pass@k, maj@k, length, entropy)."""
  out = {}
  for name, value in summary.items():
    if isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool):
      out[prefix + name] = float(value)
  return out


# --- run plumbing ---


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
    model, tokenizer = load_model(config.model, seed=config.seed)
  with config_check.user_errors("config.mesh.check_memory"):
    check_memory(config, model.config, mesh)
  n_params = sum(int(x.size) for x in jax.tree.leaves(models.params(model)))
  log.info(
    "model: %s (%.1fM parameters, %s) loaded in %s",
    model_label(config.model),
    n_params / 1e6,
    model.config.dtype,
    format_seconds(time.perf_counter() - t0),
  )
  keys = run_keys(config.seed)
  examples = load_examples(config.data, "data")
  with config_check.user_errors("config.data.reward"):
    reward = rewards.get_reward(reward_name(config.data))
  evaluator = Evaluator(config, tokenizer, keys)
  data_sources = {"data": examples_source(examples), "eval": examples_source(evaluator.examples)}
  for i, spec in enumerate(evaluator.extra):
    data_sources[f"eval.extra_tasks[{i}]"] = examples_source(spec.examples)
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
    score=make_scorer(tokenizer, reward),
    evaluator=evaluator,
    mesh=mesh,
    eos_ids=eos_ids(tokenizer),
    pad_id=pad_id(tokenizer),
    data_sources=data_sources,
  )


def examples_source(examples: Sequence[dict]) -> dict[str, Any]:
  """Where a training or evaluation pool comes from (`TaskExamples.source`), or its length."""
  return dict(getattr(examples, "source", None) or {"used": len(examples)})


def model_label(model_config: Mapping[str, Any]) -> str:
  """A short name of config.model for log lines."""
  source = model_config.get("source")
  if source == "default":
    return "bundled SmolLM2-135M-Instruct"
  if source == "random":
    return f"random {model_config.get('preset')}"
  return f"{source} {model_config.get('path')}"


def samples_per_step(config: ml_collections.ConfigDict, method: str) -> int:
  """Completions generated by one training step: N·P for ES, P·G for GRPO (docs/method.md §1, §3).

  Logged cumulatively as `train/samples`, an equal-compute x-axis for ES and GRPO curves.
  """
  per_prompt = config.es.population_size if method == "es" else config.grpo.num_generations
  return int(config.data.prompts_per_step) * int(per_prompt)


def step_batch(ctx: Context, global_step: int) -> tuple[list[dict], np.ndarray, np.ndarray]:
  """The examples and encoded prompts of a global step."""
  idx = batch_indices(
    len(ctx.examples),
    step=global_step,
    batch=int(ctx.config.data.prompts_per_step),
    seed=int(ctx.config.seed),
    shuffle=bool(ctx.config.data.shuffle),
  )
  examples = [ctx.examples[int(i)] for i in idx]
  ids, mask = encode_examples(ctx.tokenizer, examples)
  return examples, ids, mask


@dataclasses.dataclass
class Stage:
  """One training stage: a method run for `num_steps` local steps, checkpointed in `ckpt_dir`.

  Global step = offset + local step; metrics of a stage are logged at global steps 1..num_steps
  (+ offset), the base model's evaluation at global step 0 by the first stage only.
  """

  name: str  # "es" | "grpo"
  num_steps: int
  ckpt_dir: str
  offset: int = 0
  label: str | None = None  # the `stage` column of metrics.jsonl (sequential runs)
  samples_offset: int = 0  # completions generated by the stages before this one


# The fields that decide a run's trajectory: a resume with other values would silently mix two
# experiments, so it is refused. Budgets (num_steps), evaluation, checkpointing, logging and the
# mesh may change between attempts.
TRAJECTORY_FIELDS = ("seed", "model", "data", "es", "grpo", "sequential")
FREE_FIELDS = ("num_steps", "total_steps")


def trajectory_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The part of the config a checkpoint must agree with (JSON-able)."""
  full = json.loads(json.dumps(config.to_dict(), default=repr))
  out = {}
  for name in TRAJECTORY_FIELDS:
    value = full.get(name)
    if isinstance(value, dict):
      value = {k: v for k, v in value.items() if k not in FREE_FIELDS}
    out[name] = value
  return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix="") -> list:
  """Dotted names whose values differ between two trajectory configs."""
  out = []
  for k in sorted(set(saved) | set(current)):
    a, b = saved.get(k), current.get(k)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      out += config_differences(a, b, f"{prefix}{k}.")
    elif a != b:
      out.append(f"{prefix}{k} ({a!r} in the checkpoint, {b!r} now)")
  return out


class StageResult(NamedTuple):
  params: Any
  finished: bool  # False: stopped by SIGTERM, before or after its last step (checkpoint saved)


def preempted() -> bool:
  """Whether the run's SIGTERM flag (`es_jax.checkpoint.sigterm_scope`) is set, on any host.

  False outside a scope. A collective with several processes: call it at the same point on all.
  """
  handler = checkpoint_lib.active_handler()
  return handler is not None and handler.should_stop()


@jax.jit
def _all_finite(tree) -> jax.Array:
  """One device reduction: whether every floating-point leaf of `tree` is finite."""
  flags = [
    jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


class NonFiniteParamsError(FloatingPointError):
  """An update produced NaN or ±inf parameters; the run stops before saving them."""


class Loop:
  """Checkpoint restore, logger, progress bar and SIGTERM handling around a stage's steps.

  Usage (a runner):
    loop = Loop(ctx, stage, state_template)
    state, start = loop.state, loop.start
    for step in loop.steps():           # local steps start+1 .. num_steps; stops on SIGTERM
      state, metrics = ...
      loop.end_step(step, state, metrics)
    return loop.close(state)
  """

  def __init__(self, ctx: Context, stage: Stage, state: Any):
    # The run's flag (one `sigterm_scope` around the whole run: a signal seen in an earlier stage
    # or at startup stops this one before its first step); a stage run alone installs its own.
    self.preempt = checkpoint_lib.active_handler()
    self._own_handler = self.preempt is None
    if self._own_handler:
      self.preempt = install_sigterm_handler()
    cfg = ctx.config.checkpoint
    positive_int(cfg.every, "checkpoint.every")
    positive_int(cfg.keep, "checkpoint.keep")
    self.ctx, self.stage = ctx, stage
    self.ckpt = Checkpointer(
      stage.ckpt_dir,
      max_to_keep=int(cfg.keep),
      save_interval_steps=int(cfg.every),
      async_save=bool(cfg.async_save),
    )
    self.run_key = jax.random.key(int(ctx.config.seed))
    restored = self.ckpt.restore_or_none(abstract_state=state)
    if (
      restored is not None
      and restored.key is not None
      and not np.array_equal(jax.random.key_data(restored.key), jax.random.key_data(self.run_key))
    ):
      raise ConfigError(
        f"config.seed={ctx.config.seed} does not give the run key saved in {stage.ckpt_dir}: "
        "resume with the original seed, or use a new workdir."
      )
    self.trajectory = trajectory_config(ctx.config)
    saved = None if restored is None else restored.meta.get("config")
    if saved is not None:
      diff = config_differences(saved, self.trajectory)
      if diff:
        raise ConfigError(
          f"{stage.ckpt_dir} holds a run with another config: {'; '.join(diff[:8])}. Resume "
          "with the same values (num_steps may grow), or use a new workdir."
        )
    if restored is None:
      self.state, self.start = state, 0
      resume = stage.offset
    else:
      self.state, self.start = restored.state, int(restored.meta["step"])
      check(
        self.start <= stage.num_steps,
        f"{stage.name}.num_steps",
        stage.num_steps,
        f"the checkpoint in {stage.ckpt_dir} is at step {self.start}, beyond the budget",
      )
      resume = stage.offset + self.start
      log.info("%s: resumed from step %d of %d", stage.name, self.start, stage.num_steps)
    if self.start == stage.num_steps:  # nothing left to run (a finished first stage): no truncation
      self.logger = RunLogger(
        ctx.workdir, config=ctx.config, resume_step=None, data_sources=ctx.data_sources
      )
    elif restored is None and stage.offset == 0:  # a fresh run: drop a killed attempt's lines
      self.logger = RunLogger(
        ctx.workdir, config=ctx.config, resume_step=-1, data_sources=ctx.data_sources
      )
      if ctx.config.eval.every > 0 and not self.preempt.should_stop():  # the base model, step 0
        self.logger.log(0, ctx.evaluator.periodic(ctx.base_params, ctx.model_config))
    else:
      self.logger = RunLogger(
        ctx.workdir, config=ctx.config, resume_step=resume, data_sources=ctx.data_sources
      )
    self.stopped = False
    self.bar = ProgressBar(
      stage.num_steps,
      initial=self.start,
      desc=stage.label or stage.name,
      enabled=None if ctx.config.progress else False,
    )
    self.timer = StepTimer(stage.num_steps, initial=self.start, name=stage.label or stage.name)
    if self.start < stage.num_steps:
      log.info(
        "%s: steps %d..%d of %d%s",
        stage.label or stage.name,
        self.start + 1,
        stage.num_steps,
        stage.num_steps,
        f" (resumed from step {self.start})" if self.start else "",
      )
    self._t = time.perf_counter()

  def log(self, step: int, values: Mapping[str, Any]) -> None:
    self.logger.log(self.stage.offset + step, values, stage=self.stage.label)

  def steps(self):
    """Local steps start+1 .. num_steps; none after a SIGTERM. A SIGTERM during the last step
    (or before a finished stage's restore) also marks the stage stopped: later stages and the
    final evaluation are skipped, a rerun continues from there."""
    for step in range(self.start + 1, self.stage.num_steps + 1):
      if self.preempt.should_stop():
        self.stopped = True
        return
      self._t = time.perf_counter()
      checkpoint_lib.sigterm_point(f"{self.stage.label or self.stage.name}:{step}")
      yield step
    self.stopped = self.preempt.should_stop()

  def step_seconds(self) -> float:
    return time.perf_counter() - self._t

  def end_step(self, step: int, state: Any, values: Mapping[str, Any], *, params=None) -> None:
    """Logs the step (plus a periodic eval when due), then checkpoints it.

    Raises:
      NonFiniteParamsError: the updated parameters hold NaN or ±inf; the step's metrics are
        logged, nothing is checkpointed, and the last checkpoint stays the newest.
    """
    values = dict(values)
    if not bool(_all_finite(state if params is None else params)):
      self.log(step, values)
      self.close()  # commits the previous (finite) checkpoint still being written
      raise NonFiniteParamsError(
        f"{self.stage.name}: the update of step {self.stage.offset + step} made parameters NaN or "
        "infinite; stopped before checkpointing them (lower the learning rate, check rewards)."
      )
    if params is not None:
      values["drift"] = float(metrics.relative_drift(params, self.ctx.base_params))
      if self.ctx.evaluator.due(step, self.stage.num_steps):
        values.update(self.ctx.evaluator.periodic(params, self.ctx.model_config))
    values["step_seconds"] = self.step_seconds()
    per_step = samples_per_step(self.ctx.config, self.stage.name)
    values["train/samples"] = self.stage.samples_offset + step * per_step
    self.log(step, values)
    reward = values.get("train/reward")
    log.info(self.timer.line(step, reward, values["step_seconds"]))
    self.state = state
    position = (self.stage.offset + step) * int(self.ctx.config.data.prompts_per_step)
    meta = {
      "data_position": position,
      "stage": self.stage.label or self.stage.name,
      "config": self.trajectory,
    }
    final = step == self.stage.num_steps or self.preempt.should_stop()
    self.ckpt.save(step, state=state, key=self.run_key, meta=meta, force=final)
    self.bar.update(1, **{k: v for k, v in values.items() if k == "train/reward"})

  def close(self) -> bool:
    """Waits for checkpoints, closes files; returns whether the stage ran to its end."""
    self.ckpt.wait()
    self.ckpt.close()
    self.bar.close()
    self.logger.close()
    if self._own_handler:
      self.preempt.uninstall()
    return not self.stopped


def metric_series(rows, key: str):
  """(steps, values) of metric `key` over metrics.jsonl rows, NaNs left out; None if absent."""
  pts = [(r["step"], r[key]) for r in rows if key in r and r[key] == r[key]]
  return tuple(zip(*pts, strict=True)) if pts else None


def train_metrics_plots(workdir: str) -> dict[str, str]:
  """reward.png and entropy.png (training curves) from workdir/metrics.jsonl."""
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  out = {}
  for name, keys, ylabel in (
    ("reward", ("fitness/mean", "reward/mean"), "mean training reward"),
    ("entropy", ("entropy/mean",), "rollout token entropy (nats)"),
  ):
    series = {key: s for key in keys if (s := metric_series(rows, key))}
    if series:
      out[name] = plots.plot_metric_over_steps(
        series, os.path.join(workdir, f"{name}.png"), ylabel=ylabel, title=name
      )
  return out


def _stopped_result(what: str) -> dict[str, Any]:
  log.warning("stopped by SIGTERM; %s, rerun the same command to resume", what)
  return {"stopped": True}


def set_aside_stale_evaluation(eval_dir: str, run_info: Mapping[str, Any]) -> str | None:
  """Renames `eval_dir` to eval.stale-<n> when its records were computed for other params than
  `run_info` says (for example a finished run resumed with a larger num_steps); returns the new
  path, or None when the records are current or absent. Nothing is deleted."""
  if not os.path.isdir(eval_dir):
    return None
  for name in sorted(os.listdir(eval_dir)):
    if not name.endswith(".meta.json"):
      continue
    with open(os.path.join(eval_dir, name)) as f:
      saved = json.load(f).get("run_info")
    if saved != json.loads(json.dumps(dict(run_info))):
      n = 1
      while os.path.exists(f"{eval_dir}.stale-{n}"):
        n += 1
      os.replace(eval_dir, f"{eval_dir}.stale-{n}")
      log.warning(
        "%s holds the evaluation of other params (%s); moved to %s, evaluating these",
        eval_dir, saved, f"{eval_dir}.stale-{n}",
      )  # fmt: skip
      return f"{eval_dir}.stale-{n}"
  return None


def finish(ctx: Context, params, *, stopped: bool) -> dict[str, Any]:
  """After the last stage: final evaluation, HF export and plots (skipped when preempted).

  A SIGTERM during the final evaluation stops it between batches (the finished problems are in
  eval/*.jsonl, a rerun evaluates the rest); then nothing is exported and DONE is not written.
  """
  if stopped or preempted():
    return _stopped_result("checkpoint saved")
  results: dict[str, Any] = {"stopped": False}
  if ctx.config.eval.final:
    eval_dir = os.path.join(ctx.workdir, "eval")
    log.info("final evaluation into %s", eval_dir)
    # The records say which params they score: a run extended to more steps re-evaluates.
    run_info = {"params_digest": checkpoint_lib.tree_digest(params)}
    set_aside_stale_evaluation(eval_dir, run_info)
    try:
      ev = ctx.evaluator.final(params, ctx.model_config, eval_dir, run_info=run_info)
    except evaluate.EvaluationStopped:
      return _stopped_result("the evaluated problems are saved in eval/")
    results["eval"] = ev["macro"]
  if preempted():
    return _stopped_result("checkpoint and evaluation saved")
  if ctx.config.export_hf:
    results["hf"] = export_hf(
      params, ctx.model_config, ctx.tokenizer, os.path.join(ctx.workdir, "hf")
    )
    log.info("exported the final model (HF format) to %s", results["hf"])
  results["plots"] = train_metrics_plots(ctx.workdir)
  (epath.Path(ctx.workdir) / "DONE").write_text("finished\n")
  log.info("done: %s", ctx.workdir)
  return results


def run_single(config: ml_collections.ConfigDict, workdir: str, name: str, train_fn) -> dict:
  """One method from the base model: `config.<name>.num_steps` steps of `train_fn`, then
  `finish` (evaluation, export, plots)."""
  with checkpoint_lib.sigterm_scope():
    ctx = make_context(config, workdir)
    n = positive_int(config[name].num_steps, f"{name}.num_steps")
    stage = Stage(name, n, os.path.join(ctx.workdir, "checkpoints"))
    result = train_fn(ctx, ctx.base_params, stage)
    return finish(ctx, result.params, stopped=not result.finished)


def evaluate_run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="evaluate"`: the final evaluation of config.model on config.eval, in workdir/eval."""
  config_check.validate(config)
  with checkpoint_lib.sigterm_scope():
    with config_check.user_errors("config.model"):
      model, tokenizer = load_model(config.model, seed=config.seed)
    evaluator = Evaluator(config, tokenizer, run_keys(config.seed))
    write_run_files(workdir, config)  # config.json and versions.json, as training runs have
    model_info = {"model": json.loads(json.dumps(config.model.to_dict(), default=repr))}
    if preempted():
      return _stopped_result("nothing evaluated yet")
    try:
      ev = evaluator.final(
        models.params(model), model.config, os.path.join(workdir, "eval"), run_info=model_info
      )
    except evaluate.EvaluationStopped:
      return _stopped_result("the evaluated problems are saved in eval/")
    return {"stopped": False, "eval": ev["macro"]}


def to_host(tree):
  return jax.tree.map(np.asarray, tree)
