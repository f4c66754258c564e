"""Evaluation: n samples per problem at temperature T plus one greedy sample → Pass@k, Maj@k.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/eval \
        --config.method=evaluate

`evaluate_model` evaluates one task (params in, results dict out, files optional),
`evaluate_tasks` several with a macro average. `Evaluator` is a run's held-out evaluation
(config.eval: periodic on a small slice in memory, final with files, plus `eval.extra_tasks`),
and `run(config, workdir)` is `method="evaluate"`: the final evaluation of config.model
(`experiments.runners.model_io.load_model`: any model source) into `workdir/eval/`:

  <label>.jsonl        one line per problem: index, id, n, c, per-sample correctness and
                       normalised answers (Maj@k), greedy_correct, mean length and token entropy
  <label>.meta.json    the sampling settings and the problems (num_problems, num_distinct,
                       num_seen_in_training, a digest); resuming with other ones is refused
  <label>.samples.jsonl  prompt, completions, extracted answers and verdicts of the first
                       `keep_samples` problems (`experiments.infra.samples_log.EvalSamples`)
  table.md, table.json greedy / Pass@1 / Pass@k / Maj@k / length / entropy per task + macro average
  timing.jsonl         one line per evaluation segment that sampled something: label, seconds,
                       problems (a resumed evaluation adds a line; the sum is the total time)
  pass_at_k.png        Pass@k against k = 1..n per task (and the macro average)

Batching and determinism (details: `experiments.evaluation.sampler`): problems go in blocks of
`batch_size`, each block one greedy batch plus its sampled rows problem-major, every generate call
[batch_size, S]. Each sample's key is a fixed function of (seed, label, problem index, sample
index, batch_size), task_key = fold_in(key, crc32(label)), whatever ran before.

Resuming. A problem's line is appended (one write, flush, fsync) once its samples are scored. A
re-run drops a torn last line, skips finished problems and every batch holding only finished ones,
and recomputes the other batches with the same layout and keys: its results equal an
uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import data, models, rewards
from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.persist import preemption
from experiments.evaluation import data as eval_data
from experiments.evaluation import results as eval_results
from experiments.evaluation import sampler as eval_sampler
from experiments.evaluation.resume import prepare as prepare_resume
from experiments.evaluation.resume import sample_decoding, task_meta
from experiments.evaluation.tasks import EvalSettings, TaskSpec
from experiments.evaluation.tasks import eval_section as eval_section  # re-exported (tests)
from experiments.infra import samples_log
from experiments.infra.logger import write_run_files
from experiments.infra.progress import EvalProgress
from experiments.runners import model_io, run_data
from experiments.schema import check as config_check
from experiments.schema.check import check

log = logging.getLogger(__name__)


# evaluate_model's arguments are not config fields: the same error without "config.".
_check = functools.partial(check, prefix="")


class EvaluationStopped(Exception):
  """`evaluate_model`'s `should_stop` returned True; the finished problems are in the jsonl."""


def evaluate_model(
  params,
  config: models.ModelConfig | None,
  tokenizer,
  task: TaskSpec,
  settings: EvalSettings,
  *,
  key: jax.Array,
  out_dir: str | None = None,
  run_info: Mapping[str, Any] | None = None,
  on_problem: Callable[[dict], None] | None = None,
  should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
  """Samples `settings.num_samples` answers per problem (plus a greedy one) and scores them.

  Args:
    params: a params dict (with `config`), a `Transformer`, or a zero-argument callable returning
      either; the callable is only called when some problem is left to evaluate.
    config: the ModelConfig for a params dict; None otherwise.
    tokenizer: the model's transformers tokenizer (prompts, decoding, EOS and pad ids).
    task: its label (file names, tables), the task or reward name that scores it, its examples
      (`es_jax.data.load_task`) and optional prompt, correctness and answer functions.
    settings: what is sampled, kept and shown (`EvalSettings`).
    key: PRNG key; samples are a fixed function of it (module docstring).
    out_dir: where to write `<label>.jsonl`, `<label>.meta.json` (and with `settings.report`, the
      table and PNG); None keeps everything in memory.
    run_info: JSON-able facts about the run (e.g. the model path) stored with the settings, so a
      resume against a different model is refused.
    on_problem: called with each new record after its line is written.
    should_stop: called before each batch that samples something; True raises
      `EvaluationStopped` (the problems finished so far are already in the jsonl).

  Returns:
    The task summary (`eval_results.summarize`: greedy, pass@k, maj@k, mean_length,
    mean_entropy, curve), plus "records" (per-problem dicts by index), "label", "task" and "timing".
  """
  examples, label, batch_size = task.examples, task.label, settings.batch_size
  _check(len(examples) > 0, "examples", len(examples), "need at least one problem")
  decoding = sample_decoding(settings, tokenizer)
  meta = task_meta(task, settings, decoding, key, run_info)
  prompt_fn = task.prompt_fn or functools.partial(data.format_prompt, tokenizer=tokenizer)
  records, stem = _open_records(out_dir, label, meta, settings.resume, examples)
  writer = sharding.is_primary()  # several hosts: each computes every record, process 0 writes
  jsonl = None if stem is None or not writer else stem + ".jsonl"
  samples = samples_log.EvalSamples(
    stem + ".samples.jsonl" if stem and writer else None,
    keep=settings.keep_samples,
    prompt_fn=prompt_fn,
    resume=settings.resume,
    save_text=settings.save_text,
  )
  scorer = _block_scorer(params, config, tokenizer, task, settings, decoding, prompt_fn)
  progress = EvalProgress(label, len(examples), len(records), settings)
  task_key = jax.random.fold_in(key, zlib.crc32(label.encode()) & 0x7FFFFFFF)
  for start in range(0, len(examples), batch_size):
    block = range(start, min(start + batch_size, len(examples)))
    if all(i in records for i in block):
      continue
    if should_stop is not None and should_stop():
      progress.close()
      raise EvaluationStopped(f"{label}: stopped before problem {start} of {len(examples)}")
    block_key = jax.random.fold_in(task_key, start // batch_size)
    for i, scored in scorer.score_block(examples, block, set(records), block_key):
      scored = samples.take(i, examples[i], scored)  # its samples line first: no duplicate
      records[i] = eval_results.make_record(i, examples[i], scored)
      if jsonl is not None:
        eval_results.append_record(jsonl, records[i])
      if on_problem is not None:
        on_problem(records[i])
      progress.update(records)
  seconds = progress.close()
  if jsonl is not None and scorer.calls:
    eval_results.append_timing(out_dir, label, seconds=seconds, problems=progress.new(records))
  return _summary(task, settings, records, scorer, seconds, out_dir if writer else None)


def _open_records(
  out_dir: str | None, label: str, meta: dict, resume: bool, examples: Sequence[dict]
) -> tuple[dict[int, dict], str | None]:
  """(the finished records of out_dir's jsonl by index, the files' stem; None without out_dir).

  Process 0 opens (or repairs, or starts) the jsonl and checks `meta` against the saved
  settings; the other hosts then read the repaired file. A record whose id is not its example's
  raises ValueError: the task's data changed."""
  records: dict[int, dict] = {}
  if out_dir is None:
    return records, None
  stem = eval_results.file_stem(out_dir, label)
  jsonl = stem + ".jsonl"
  writer = sharding.is_primary()
  if writer:
    os.makedirs(out_dir, exist_ok=True)
    records = eval_results.open_records(jsonl, stem + ".meta.json", meta, resume=resume)
  sharding.sync_hosts(f"es_jax_eval_open_{label}")
  if not writer and os.path.exists(jsonl):  # the shared workdir's records, as repaired
    records = {r["index"]: r for r in eval_results.read_records(jsonl)}
  records = {i: r for i, r in records.items() if i < len(examples)}
  for i, r in records.items():
    if r["id"] != eval_results.example_id(examples[i], i):
      raise ValueError(
        f"{jsonl}: problem {i} has id {r['id']!r} but the examples give "
        f"{examples[i].get('id')!r}; the task's data changed: add --config.eval.restart=True."
      )
  return records, stem


def _block_scorer(params, config, tokenizer, task, settings, decoding, prompt_fn):
  """The `eval_sampler.BlockScorer` of `task` under `settings`, sampling with `decoding` (its
  stop and pad tokens the tokenizer's); default scoring: the task's."""
  return eval_sampler.BlockScorer(
    params,
    config,
    tokenizer,
    n=settings.num_samples,
    batch_size=settings.batch_size,
    decoding=decoding,
    greedy=settings.greedy,
    refill=settings.refill,
    prompt_fn=prompt_fn,
    correct_fn=task.correct_fn or functools.partial(rewards.is_correct, task=task.task),
    answer_fn=task.answer_fn or functools.partial(rewards.answer_key, task=task.task),
  )


def _summary(task, settings, records, scorer, seconds, out_dir) -> dict[str, Any]:
  """`evaluate_model`'s result; with out_dir and `settings.report`, the task's report too."""
  ordered = [records[i] for i in sorted(records)]
  votes = task.answer_fn is not None or eval_results.has_votes(task.task)
  summary = eval_results.summarize(ordered, ks=settings.ks, votes=votes)
  if task.num_seen_in_training is not None:  # a run's evaluation: its problems' counts
    counts = eval_data.problem_counts(task)
    summary.update({k: counts[k] for k in ("num_distinct", "num_seen_in_training")})
  if out_dir is not None and settings.report:
    eval_results.write_report({task.label: summary}, out_dir)
  timing = {
    "seconds": seconds,
    "generate_calls": scorer.calls,
    "new_tokens": scorer.new_tokens,
    "tokens_per_s": scorer.new_tokens / max(seconds, 1e-9),
  }
  level = logging.INFO if settings.log_progress else logging.DEBUG  # periodic: the caller's line
  log.log(level, "eval %s: %s (%.1f s)", task.label, eval_results.one_line(summary), seconds)
  return {**summary, "label": task.label, "task": task.task, "records": ordered, "timing": timing}


def evaluate_tasks(
  params,
  config: models.ModelConfig | None,
  tokenizer,
  tasks: Sequence[TaskSpec],
  settings: EvalSettings,
  *,
  key: jax.Array,
  out_dir: str | None = None,
  run_info: Mapping[str, Any] | None = None,
  should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
  """`evaluate_model` on each task, then one table and plot with the macro average.

  Args:
    params, config, tokenizer, settings, run_info, should_stop: as in `evaluate_model`; a loader
      callable is called at most once; `settings.report` is ignored (one report for all tasks).
    tasks: TaskSpecs with unique labels; those with `average` False are left out of the macro
      average (reported in their own rows).
    key: PRNG key; each task draws from fold_in(key, crc32(label)), so tasks do not share samples
      and adding a task does not change the others.
    out_dir: where every task's files and the combined report go.

  Returns:
    {"tasks": {label: evaluate_model results}, "macro": metrics macro-averaged over the tasks
    with `average`, "macro_tasks": their labels}.
  """
  labels = [t.label for t in tasks]
  _check(len(tasks) > 0, "tasks", labels, "need at least one task")
  _check(len(set(labels)) == len(labels), "tasks labels", labels, "labels must be unique")
  if callable(params) and not isinstance(params, (models.Transformer, Mapping)):
    params = functools.cache(params)
  each = dataclasses.replace(settings, report=False)
  results = {}
  for spec in tasks:
    results[spec.label] = evaluate_model(
      params,
      config,
      tokenizer,
      spec,
      each,
      key=key,
      out_dir=out_dir,
      run_info=run_info,
      should_stop=should_stop,
    )
  extra = ("records", "timing", "label", "task")  # table.json holds metrics only (deterministic)
  summaries = {
    label: {k: v for k, v in r.items() if k not in extra} for label, r in results.items()
  }
  averaged = [t.label for t in tasks if t.average]
  _check(bool(averaged), "tasks average", labels, "at least one task must enter the average")
  macro = eval_results.macro({label: summaries[label] for label in averaged})
  if out_dir is not None and sharding.is_primary():
    eval_results.write_report(summaries, out_dir, averaged=averaged)
  return {"tasks": results, "macro": macro, "macro_tasks": averaged}


class Evaluator:
  """Held-out evaluation of params: periodic (small slice, in memory) and final (files)."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    tokenizer,
    keys: Mapping[str, jax.Array],
    tasks: eval_data.EvalTasks | None = None,
  ):
    """`tasks`: the config's evaluation tasks (`eval_data.load_eval_tasks`, loaded before the
    model by the runners); None loads them now. Checks a user's reward; `tokenizer` may be None
    until evaluating."""
    ev = config.eval  # validated by the runner (experiments.schema.check)
    self.config, self.tokenizer, self.key = ev, tokenizer, keys["eval"]
    self.layout = run_data.decode_layout(config)
    # The final evaluation also covers eval.extra_tasks (loaded now, so bad entries fail before
    # training): held-out tasks for forgetting, or several benchmarks averaged (macro). Every
    # task's problems are disjoint from the training pool (experiments.evaluation.data).
    tasks = eval_data.load_eval_tasks(config) if tasks is None else tasks
    self.task, self.label, self.examples = tasks.main.task, tasks.main.label, tasks.main.examples
    self.correct_fn = run_data.eval_correct_fn(config.data, self.task, self.examples)
    self.main, self.extra = tasks.main._replace(correct_fn=self.correct_fn), tasks.extra

  def settings(self, num_samples: int) -> EvalSettings:
    ev = self.config
    decoding = sampling.Decoding(
      int(ev.max_new_tokens), float(ev.temperature), float(ev.top_p), **self.layout
    )
    return EvalSettings(
      num_samples=num_samples,
      decoding=decoding,
      batch_size=int(ev.batch_size),
      refill=bool(ev.refill),
      ks=tuple(k for k in ev.ks if k <= num_samples) or (1,),
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
    summary = evaluate_model(
      models.cast_params(params, model_config.jnp_dtype),  # masters sample in compute dtype
      model_config,
      self.tokenizer,
      TaskSpec(self.label, self.task, examples, correct_fn=self.correct_fn),
      self.settings(n),
      key=self.key,
    )
    return flat_summary(summary, prefix="eval/")

  def final(
    self, params, model_config: models.ModelConfig, out_dir: str, run_info=None
  ) -> dict[str, Any]:
    """The full evaluation written into `out_dir` (resumable, see experiments.evaluation.evaluate);
    `run_info` (e.g. the model config) is stored with the settings: a resume must match it.

    Raises:
      EvaluationStopped: the run's SIGTERM flag was set before a batch.
    """
    n = int(self.config.num_samples)
    settings = dataclasses.replace(
      self.settings(n), log_progress=True, keep_samples=int(self.config.keep_samples)
    )
    return evaluate_tasks(
      models.cast_params(params, model_config.jnp_dtype),
      model_config,
      self.tokenizer,
      [self.main, *self.extra],
      settings,
      key=self.key,
      out_dir=out_dir,
      run_info=run_info,
      should_stop=preemption.preempted,
    )


def flat_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """The scalar entries of an evaluation summary (greedy, pass@k, maj@k, length, entropy)."""
  out = {}
  for name, value in summary.items():
    if isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool):
      out[prefix + name] = float(value)
  return out


def stopped_result(what: str) -> dict[str, Any]:
  """A run's result when SIGTERM stopped it (`what` says what was saved), logged."""
  log.warning("stopped by SIGTERM; %s, rerun the same command to resume", what)
  return {"stopped": True}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="evaluate"`: the final evaluation of config.model on config.eval, in workdir/eval."""
  config_check.validate(config)
  with preemption.sigterm_scope():
    # The files, the reward and the disjointness check before the model: a refusal comes first.
    evaluator = Evaluator(config, None, run_data.run_keys(config.seed))
    with config_check.user_errors("config.model"):
      model, tokenizer = model_io.load_model(config.model, seed=config.seed)
    evaluator.tokenizer = tokenizer
    prepare_resume(evaluator, os.path.join(workdir, "eval"), restart=config.eval.restart)
    write_run_files(workdir, config)  # config.json and versions.json, after the checks
    model_info = {"model": json.loads(json.dumps(config.model.to_dict(), default=repr))}
    if preemption.preempted():
      return stopped_result("nothing evaluated yet")
    try:
      ev = evaluator.final(
        models.params(model), model.config, os.path.join(workdir, "eval"), run_info=model_info
      )
    except EvaluationStopped:
      return stopped_result("the evaluated problems are saved in eval/")
    return {"stopped": False, "eval": ev["macro"]}
