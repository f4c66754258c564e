"""Evaluation: n samples per problem at temperature T plus one greedy sample → Pass@k, Maj@k.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/eval \
        --config.method=evaluate

`evaluate_model` evaluates one task (params in, results dict out, files optional),
`evaluate_tasks` several with a macro average. `Evaluator` is a run's held-out evaluation
(config.eval: periodic on a small slice in memory, final with files, plus `eval.extra_tasks`),
and `run(config, workdir)` is `method="evaluate"`: the final evaluation of config.model
(`experiments.model_io.load_model`: any model source) into `workdir/eval/`:

  <label>.jsonl        one line per problem: index, id, n, c, per-sample correctness and
                       normalised answers (Maj@k), greedy_correct, mean length and token entropy
  <label>.meta.json    the sampling settings; resuming with different settings is refused
  <label>.samples.jsonl  prompt, completions, extracted answers and verdicts of the first
                       `keep_samples` problems (`experiments.samples_log.EvalSamples`)
  table.md, table.json greedy / Pass@1 / Pass@k / Maj@k / length / entropy per task + macro average
  timing.jsonl         one line per evaluation segment that sampled something: label, seconds,
                       problems (a resumed evaluation adds a line; the sum is the total time)
  pass_at_k.png        Pass@k against k = 1..n per task (and the macro average)

Batching and determinism (details: `experiments.eval_sampler`): problems go in blocks of
`batch_size`, each block one greedy batch plus its sampled rows problem-major, every generate call
[batch_size, S]. Each sample's key is a fixed function of (seed, label, problem index, sample
index, batch_size), task_key = fold_in(key, crc32(label)), whatever ran before.

Resuming. A problem's line is appended (one write, flush, fsync) once its samples are scored. A
re-run drops a torn last line, skips finished problems and every batch holding only finished ones,
and recomputes the other batches with the same layout and keys: its results equal an
uninterrupted run's.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import tqdm

from es_jax import data, models, preemption, rewards, sampling, sharding
from experiments import config_check, eval_results, eval_sampler, model_io, run_data, samples_log
from experiments.config_check import check, positive_int
from experiments.eval_tasks import TaskSpec, extra_eval_tasks, task_label
from experiments.logger import format_seconds, progress_marks, write_run_files

log = logging.getLogger(__name__)


# evaluate_model's arguments are not config fields: the same error without "config.".
_check = functools.partial(check, prefix="")


class EvaluationStopped(Exception):
  """`evaluate_model`'s `should_stop` returned True; the finished problems are in the jsonl."""


def evaluate_model(
  params,
  config: models.ModelConfig | None,
  tokenizer,
  examples: Sequence[dict],
  *,
  task: str,
  num_samples: int,
  max_new_tokens: int,
  batch_size: int,
  key: jax.Array,
  temperature: float = 0.6,
  top_p: float = 1.0,
  greedy: bool = True,
  ks: Sequence[int] = (1, 16, 32),
  out_dir: str | None = None,
  resume: bool = True,
  progress: bool = True,
  label: str | None = None,
  report: bool = True,
  eos_ids: Sequence[int] | None = None,
  prompt_fn: Callable[[dict], str] | None = None,
  correct_fn: Callable[[str, dict], bool] | None = None,
  answer_fn: Callable[[str], Any] | None = None,
  on_problem: Callable[[dict], None] | None = None,
  save_text: bool = False,
  keep_samples: int = 0,
  run_info: Mapping[str, Any] | None = None,
  log_progress: bool = False,
  should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
  """Samples `num_samples` answers per problem (plus a greedy one) and scores them.

  Args:
    params: a params dict (with `config`), a `Transformer`, or a zero-argument callable returning
      either; the callable is only called when some problem is left to evaluate.
    config: the ModelConfig for a params dict; None otherwise.
    tokenizer: the model's transformers tokenizer (prompts, decoding, EOS and pad ids).
    examples: the task's examples (`es_jax.data.load_task`).
    task: the task or reward name for `es_jax.rewards.is_correct` / `answer_key`.
    num_samples: n, samples per problem at `temperature` (paper: 32).
    max_new_tokens: decode budget per sample.
    batch_size: rows per generate call (fixed; see the module docstring for the layout).
    key: PRNG key; samples are a fixed function of it (module docstring).
    temperature: sampling temperature (paper: 0.6).
    top_p: nucleus mass (paper: 1.0, i.e. off).
    greedy: also decode one greedy sample per problem.
    ks: the k of Pass@k and Maj@k in the table; those above n are dropped, 1 is always kept.
    out_dir: where to write `<label>.jsonl`, `<label>.meta.json` (and with `report`, the table and
      PNG); None keeps everything in memory.
    resume: reuse the finished problems in out_dir's jsonl; False starts over.
    progress: show a tqdm bar (only when stderr is a terminal).
    label: the name in file names and tables (default: `task`).
    report: write table.md, table.json and pass_at_k.png for this task alone into out_dir.
    eos_ids: tokens ending a sample (default: the tokenizer's EOS).
    prompt_fn: example → prompt text (default: `es_jax.data.format_prompt(example, tokenizer)`).
    correct_fn: (completion, example) → bool (default: `rewards.is_correct(..., task=task)`).
    answer_fn: completion → normalised answer or None for Maj@k (default: `rewards.answer_key`).
    on_problem: called with each new record after its line is written.
    save_text: also store the decoded completions in the records.
    keep_samples: write `<label>.samples.jsonl` (with out_dir) for the first this many problems.
    run_info: JSON-able facts about the run (e.g. the model path) stored with the settings, so a
      resume against a different model is refused.
    log_progress: log a progress line (problems done, Pass@1 so far, ETA) about every 10%, and
      the summary at INFO (else DEBUG).
    should_stop: called before each batch that samples something; True raises
      `EvaluationStopped` (the problems finished so far are already in the jsonl).

  Returns:
    The task summary (`eval_results.summarize`: greedy, pass@k, maj@k, mean_length,
    mean_entropy, curve), plus "records" (per-problem dicts by index), "label", "task" and "timing".
  """
  label = label or task
  n = int(num_samples)
  _check(len(examples) > 0, "examples", len(examples), "need at least one problem")
  _check(n >= 1, "num_samples", num_samples, "must be >= 1")
  _check(batch_size >= 1, "batch_size", batch_size, "must be >= 1")
  _check(max_new_tokens >= 1, "max_new_tokens", max_new_tokens, "must be >= 1")
  _check(temperature >= 0, "temperature", temperature, "must be >= 0")
  _check(0 < top_p <= 1, "top_p", top_p, "must be in (0, 1]")
  if eos_ids is None:
    eos_ids = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
  eos_ids = tuple(int(e) for e in eos_ids)
  pad_id = sampling.pad_id(tokenizer)
  settings = {
    "label": label,
    "task": task,
    "num_samples": n,
    "temperature": float(temperature),
    "top_p": float(top_p),
    "max_new_tokens": int(max_new_tokens),
    "batch_size": int(batch_size),
    "greedy": bool(greedy),
    "eos_ids": list(eos_ids),
    "pad_id": pad_id,
    "key": eval_results.key_json(key),
    "run_info": json.loads(json.dumps(run_info)) if run_info else None,
  }
  records: dict[int, dict] = {}
  jsonl = stem = None
  prompt_fn = prompt_fn or functools.partial(data.format_prompt, tokenizer=tokenizer)
  writer = sharding.is_primary()  # several hosts: each computes every record, process 0 writes
  if out_dir is not None:
    stem = os.path.join(out_dir, re.sub(r"[^A-Za-z0-9._-]+", "_", label))
    jsonl = stem + ".jsonl"
    if writer:
      os.makedirs(out_dir, exist_ok=True)
      records = eval_results.open_records(jsonl, stem + ".meta.json", settings, resume=resume)
    sharding.sync_hosts(f"es_jax_eval_open_{label}")
    if not writer and os.path.exists(jsonl):  # the shared workdir's records, as repaired
      records = {r["index"]: r for r in eval_results.read_records(jsonl)}
  samples = samples_log.EvalSamples(
    stem + ".samples.jsonl" if stem and writer else None,
    keep=keep_samples,
    prompt_fn=prompt_fn,
    resume=resume,
    save_text=save_text,
  )
  records = {i: r for i, r in records.items() if i < len(examples)}
  for i, r in records.items():
    if r["id"] != eval_results.example_id(examples[i], i):
      raise ValueError(
        f"{jsonl}: problem {i} has id {r['id']!r} but the examples give "
        f"{examples[i].get('id')!r}; the task's data changed: use a new out_dir or resume=False."
      )

  scorer = eval_sampler.BlockScorer(
    params,
    config,
    tokenizer,
    n=n,
    batch_size=int(batch_size),
    temperature=float(temperature),
    greedy=greedy,
    generate_kwargs=dict(
      max_new_tokens=int(max_new_tokens), top_p=top_p, eos_ids=eos_ids, pad_id=pad_id
    ),
    prompt_fn=prompt_fn,
    correct_fn=correct_fn or functools.partial(rewards.is_correct, task=task),
    answer_fn=answer_fn or functools.partial(rewards.answer_key, task=task),
  )
  t0, done = time.perf_counter(), len(records)
  task_key = jax.random.fold_in(key, zlib.crc32(label.encode()) & 0x7FFFFFFF)
  tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
  bar = tqdm.tqdm(
    total=len(examples),
    initial=len(records),
    desc=label,
    unit="problem",
    disable=not (progress and tty),
  )
  marks = progress_marks(len(examples), done) if log_progress else set()
  if log_progress and done < len(examples):
    log.info("eval %s: %d problems (%d done before), n = %d", label, len(examples), done, n)
  for start in range(0, len(examples), batch_size):
    block = range(start, min(start + batch_size, len(examples)))
    if all(i in records for i in block):
      continue
    if should_stop is not None and should_stop():
      bar.close()
      raise EvaluationStopped(f"{label}: stopped before problem {start} of {len(examples)}")
    block_key = jax.random.fold_in(task_key, start // batch_size)
    for i, scored in scorer.score_block(examples, block, set(records), block_key):
      scored = samples.take(i, examples[i], scored)  # its samples line first: no duplicate
      records[i] = eval_results.make_record(i, examples[i], scored)
      if jsonl is not None and writer:
        eval_results.append_record(jsonl, records[i])
      if on_problem is not None:
        on_problem(records[i])
      pass_at_1 = np.mean([r["c"] / r["n"] for r in records.values()])
      bar.set_postfix_str(f"pass@1 {pass_at_1:.3f}", refresh=False)
      bar.update(1)
      if len(records) in marks:
        elapsed = time.perf_counter() - t0
        eta = elapsed / (len(records) - done) * (len(examples) - len(records))
        times = format_seconds(elapsed), format_seconds(eta)
        line = "eval %s: %d/%d problems | pass@1 %.3f | %s | ETA %s"
        log.info(line, label, len(records), len(examples), pass_at_1, *times)
  bar.close()
  seconds = time.perf_counter() - t0
  if jsonl is not None and scorer.calls and writer:
    eval_results.append_timing(out_dir, label, seconds=seconds, problems=len(records) - done)
  ordered = [records[i] for i in sorted(records)]
  summary = eval_results.summarize(ordered, ks=ks)
  if out_dir is not None and report and writer:
    eval_results.write_report({label: summary}, out_dir)
  timing = {
    "seconds": seconds,
    "generate_calls": scorer.calls,
    "new_tokens": scorer.new_tokens,
    "tokens_per_s": scorer.new_tokens / max(seconds, 1e-9),
  }
  level = logging.INFO if log_progress else logging.DEBUG  # periodic: the caller's own line
  log.log(level, "eval %s: %s (%.1f s)", label, eval_results.one_line(summary), seconds)
  return {**summary, "label": label, "task": task, "records": ordered, "timing": timing}


def evaluate_tasks(
  params,
  config: models.ModelConfig | None,
  tokenizer,
  tasks: Sequence[TaskSpec],
  *,
  key: jax.Array,
  out_dir: str | None = None,
  **kwargs,
) -> dict[str, Any]:
  """`evaluate_model` on each task, then one table and plot with the macro average.

  Args:
    params, config, tokenizer: as in `evaluate_model`; a loader callable is called at most once.
    tasks: TaskSpecs with unique labels; those with `average` False are left out of the macro
      average (reported in their own rows).
    key: PRNG key; each task draws from fold_in(key, crc32(label)), so tasks do not share samples
      and adding a task does not change the others.
    out_dir: where every task's files and the combined report go.
    **kwargs: the remaining keyword arguments of `evaluate_model`.

  Returns:
    {"tasks": {label: evaluate_model results}, "macro": metrics macro-averaged over the tasks
    with `average`, "macro_tasks": their labels}.
  """
  labels = [t.label for t in tasks]
  _check(len(tasks) > 0, "tasks", labels, "need at least one task")
  _check(len(set(labels)) == len(labels), "tasks labels", labels, "labels must be unique")
  if callable(params) and not isinstance(params, (models.Transformer, Mapping)):
    params = functools.cache(params)
  results = {}
  for spec in tasks:
    results[spec.label] = evaluate_model(
      params,
      config,
      tokenizer,
      spec.examples,
      task=spec.task,
      label=spec.label,
      key=key,
      out_dir=out_dir,
      report=False,
      **kwargs,
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

  def __init__(self, config: ml_collections.ConfigDict, tokenizer, keys: Mapping[str, jax.Array]):
    ev = config.eval
    names = "limit num_samples max_new_tokens batch_size periodic_limit periodic_num_samples"
    for name in names.split():
      positive_int(ev[name], f"eval.{name}")
    check(isinstance(ev.every, int) and ev.every >= 0, "eval.every", ev.every, "need an int >= 0")
    self.config, self.tokenizer, self.key = ev, tokenizer, keys["eval"]
    section, self.task, self.label = eval_section(config)
    options = run_data.file_options(config.data)
    self.examples = run_data.load_examples(section, "eval", options=options)
    # The final evaluation also covers eval.extra_tasks (loaded now, so bad entries fail before
    # training): held-out tasks for forgetting, or several benchmarks averaged (macro).
    self.extra = extra_eval_tasks(section, taken={self.label})

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
    summary = evaluate_model(
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
      EvaluationStopped: the run's SIGTERM flag was set before a batch.
    """
    n = int(self.config.num_samples)
    return evaluate_tasks(
      models.cast_params(params, model_config.jnp_dtype),
      model_config,
      self.tokenizer,
      [TaskSpec(self.label, self.task, self.examples), *self.extra],
      out_dir=out_dir,
      log_progress=True,
      keep_samples=int(self.config.keep_samples),
      run_info=run_info,
      should_stop=preemption.preempted,
      **self._kwargs(n),
    )


def eval_section(config: ml_collections.ConfigDict) -> tuple[dict[str, Any], str, str]:
  """(config.eval as a dict, plus config.progress, the name that scores it, its label). Task
  "file" reads eval.path, else data.path (the training file: logged as a warning), and scores
  with data.reward."""
  ev = config.eval
  section = {k: ev[k] for k in ev.keys()}
  section["progress"] = bool(config.get("progress", True))  # TFDS's bars (run_data)
  if ev.task != data.FILE_TASK:
    return section, ev.task, task_label(ev.task)
  if not section.get("path"):
    section["path"] = config.data.path
    log.warning("eval.path is empty: evaluating on the training file %s", config.data.path)
  stem = os.path.splitext(os.path.basename(section["path"]))[0]
  return section, config.data.reward, task_label(f"file_{stem}")


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
    with config_check.user_errors("config.model"):
      model, tokenizer = model_io.load_model(config.model, seed=config.seed)
    evaluator = Evaluator(config, tokenizer, run_data.run_keys(config.seed))
    write_run_files(workdir, config)  # config.json and versions.json, as training runs have
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
