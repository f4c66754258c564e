"""Evaluation runner: n samples per problem at temperature T plus one greedy sample → Pass@k, Maj@k.

    python -m experiments.evaluate --workdir /tmp/eval --limit 16 --num_samples 8 \
        --max_new_tokens 64

`evaluate_model` evaluates one task (params in, results dict out, files optional), `evaluate_tasks`
several with a macro average, and `run(config, workdir)` loads the model and tasks that a
ConfigDict names (fields: `default_config()`) and writes into `workdir/eval/`:

  <label>.jsonl        one line per problem: index, id, n, c, per-sample correctness and
                       normalised answers (Maj@k), greedy_correct, mean length and token entropy
  <label>.meta.json    the sampling settings; resuming with different settings is refused
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

import argparse
import functools
import json
import logging
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from es_jax import data, models, rewards, sampling
from experiments import eval_results, eval_sampler
from experiments.config_check import ConfigError
from experiments.logger import format_seconds, progress_marks

log = logging.getLogger(__name__)
MODEL_SOURCES = ("default", "hf", "gguf", "orbax")
read_records = eval_results.read_records
summarize = eval_results.summarize
write_report = eval_results.write_report


class TaskSpec(NamedTuple):
  """One task of `evaluate_tasks`: a unique label, the reward/task name, its examples."""

  label: str
  task: str
  examples: Sequence[dict]


def default_config() -> ml_collections.ConfigDict:
  """The fields `run` reads, with the paper's sampling settings (docs/method.md §5)."""
  return ml_collections.ConfigDict(
    {
      # source: default (bundled SmolLM2) | hf | gguf | orbax. For orbax, `path` is the
      # checkpoint directory and base_source/base_path give the architecture and tokenizer.
      "model": {
        "source": "default",
        "path": "",
        "base_source": "default",
        "base_path": "",
        "dtype": "",
      },
      "tasks": [
        {
          "name": "reasoning_gym/chain_sum",
          "split": "test",
          "limit": 64,
          "task_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        }
      ],
      "num_samples": 32,
      "temperature": 0.6,
      "top_p": 1.0,
      "max_new_tokens": 256,
      "batch_size": 64,
      "seed": 0,
      "ks": (1, 4, 16, 32),
      "greedy": True,
      "progress": True,
    }
  )


def _check(cond: bool, field: str, value: Any, need: str):
  if not cond:
    raise ConfigError(f"{field}={value!r} is invalid: {need}.")


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
    run_info: JSON-able facts about the run (e.g. the model path) stored with the settings, so a
      resume against a different model is refused.
    log_progress: log a progress line (problems done, Pass@1 so far, ETA) about every 10%.
    should_stop: called before each batch that samples something; True raises
      `EvaluationStopped` (the problems finished so far are already in the jsonl).

  Returns:
    The task summary (`summarize`: greedy, pass@k, maj@k, mean_length, mean_entropy, curve),
    plus "records" (per-problem dicts by index), "label", "task" and "timing".
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
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key_data = np.asarray(jax.random.key_data(key)).reshape(-1).tolist()
  else:
    key_data = np.asarray(key).reshape(-1).tolist()
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
    "key": key_data,
    "run_info": json.loads(json.dumps(run_info)) if run_info else None,
  }
  records: dict[int, dict] = {}
  jsonl = None
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, re.sub(r"[^A-Za-z0-9._-]+", "_", label))
    jsonl = stem + ".jsonl"
    records = eval_results.open_records(jsonl, stem + ".meta.json", settings, resume=resume)
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
    save_text=save_text,
    generate_kwargs=dict(
      max_new_tokens=int(max_new_tokens), top_p=top_p, eos_ids=eos_ids, pad_id=pad_id
    ),
    prompt_fn=prompt_fn or functools.partial(data.format_prompt, tokenizer=tokenizer),
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
  already = len(records)
  marks = progress_marks(len(examples), already) if log_progress else set()
  if log_progress and already < len(examples):
    log.info("eval %s: %d problems (%d done before), n = %d", label, len(examples), already, n)
  for start in range(0, len(examples), batch_size):
    block = range(start, min(start + batch_size, len(examples)))
    if all(i in records for i in block):
      continue
    if should_stop is not None and should_stop():
      bar.close()
      raise EvaluationStopped(f"{label}: stopped before problem {start} of {len(examples)}")
    block_key = jax.random.fold_in(task_key, start // batch_size)
    for i, scored in scorer.score_block(examples, block, set(records), block_key):
      records[i] = eval_results.make_record(i, examples[i], scored)
      if jsonl is not None:
        eval_results.append_record(jsonl, records[i])
      if on_problem is not None:
        on_problem(records[i])
      pass_at_1 = np.mean([r["c"] / r["n"] for r in records.values()])
      bar.set_postfix_str(f"pass@1 {pass_at_1:.3f}", refresh=False)
      bar.update(1)
      if len(records) in marks:
        elapsed = time.perf_counter() - t0
        eta = elapsed / (len(records) - already) * (len(examples) - len(records))
        log.info(
          "eval %s: %d/%d problems | pass@1 %.3f | %s | ETA %s",
          label,
          len(records),
          len(examples),
          pass_at_1,
          format_seconds(elapsed),
          format_seconds(eta),
        )
  bar.close()
  seconds = time.perf_counter() - t0
  if jsonl is not None and scorer.calls:
    eval_results.append_timing(out_dir, label, seconds=seconds, problems=len(records) - done)
  ordered = [records[i] for i in sorted(records)]
  summary = summarize(ordered, ks=ks)
  if out_dir is not None and report:
    write_report({label: summary}, out_dir)
  timing = {
    "seconds": seconds,
    "generate_calls": scorer.calls,
    "new_tokens": scorer.new_tokens,
    "tokens_per_s": scorer.new_tokens / max(seconds, 1e-9),
  }
  log.info("%s: %s (%.1f s)", label, eval_results.one_line(summary), seconds)
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
    tasks: TaskSpecs with unique labels.
    key: PRNG key; each task draws from fold_in(key, crc32(label)), so tasks do not share samples
      and adding a task does not change the others.
    out_dir: where every task's files and the combined report go.
    **kwargs: the remaining keyword arguments of `evaluate_model`.

  Returns:
    {"tasks": {label: evaluate_model results}, "macro": macro-averaged metrics}.
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
  macro = eval_results.macro(summaries)
  if out_dir is not None:
    write_report(summaries, out_dir)
  return {"tasks": results, "macro": macro}


MODEL_DTYPES = ("", "bfloat16", "float32", "float16")


def load_model(model_config: Mapping[str, Any]):
  """(Transformer, tokenizer) for config.model (see `default_config`).

  `model.dtype` is the compute dtype: "" keeps the checkpoint's (bf16 for the paper's HF
  checkpoints; float32 for dequantised GGUF files), or "bfloat16" / "float32" / "float16".
  """
  source, path = model_config.get("source"), model_config.get("path") or ""
  _check(source in MODEL_SOURCES, "config.model.source", source, f"use one of {MODEL_SOURCES}")
  dtype = model_config.get("dtype") or ""
  _check(dtype in MODEL_DTYPES, "config.model.dtype", dtype, f"use one of {MODEL_DTYPES}")
  if source == "default":
    return models.load_default(dtype=dtype or "float32")
  _check(bool(path), "config.model.path", path, f"source {source!r} needs a path")
  if source == "hf":
    return models.load_hf(path, dtype=dtype or None)
  if source == "gguf":
    return models.load_gguf(path, dtype=dtype or "float32")
  base = {"source": model_config.get("base_source") or "default", "dtype": dtype}
  base["path"] = model_config.get("base_path")
  _check(base["source"] != "orbax", "config.model.base_source", "orbax", "the base is not orbax")
  step = model_config.get("step")
  params = restore_params(path, step=None if step is None else int(step))
  model, tokenizer = load_model(base)
  # The checkpoint's params keep their dtype (float32 masters of a bf16 model stay float32);
  # the model computes in the base config's dtype (`forward` casts).
  return models.from_params(model.config, params), tokenizer


def restore_params(directory: str, *, step: int | None = None) -> dict[str, Any]:
  """The params of an Orbax checkpoint written with `es_jax.checkpoint.Checkpointer`.

  The checkpoint's state is the params dict itself or a mapping holding it under "params".

  Args:
    directory: the checkpoint directory (local or gs://).
    step: the step to restore; None for the newest readable one.

  Raises:
    NotImplementedError: this checkout has no `es_jax.checkpoint.Checkpointer`.
    FileNotFoundError: no such local directory, or no checkpoint in it.
  """
  try:
    from es_jax.checkpoint import Checkpointer
  except ImportError as e:
    raise NotImplementedError(
      f"config.model.source='orbax' ({directory}) needs es_jax.checkpoint.Checkpointer ({e}); "
      "export the run as an HF directory (save_hf) and use source='hf'."
    ) from None
  if "://" not in str(directory) and not os.path.isdir(directory):
    raise FileNotFoundError(f"config.model.path={directory!r}: no such checkpoint directory.")
  checkpointer = Checkpointer(directory, async_save=False)
  try:
    state = checkpointer.restore(step).state
  finally:
    checkpointer.close()
  if isinstance(state, Mapping) and "params" in state:
    state = state["params"]
  return jax.tree.map(jnp.asarray, state)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Evaluates the model config.model names on config.tasks; writes into `workdir/eval/`."""
  for field in ("num_samples", "max_new_tokens", "batch_size"):
    value = config.get(field)
    _check(isinstance(value, int) and value >= 1, f"config.{field}", value, "need an int >= 1")
  tasks_config = list(config.get("tasks") or [])
  _check(bool(tasks_config), "config.tasks", tasks_config, "need at least one {name, split}")
  model, tokenizer = load_model(config.model)
  specs = []
  for i, t in enumerate(tasks_config):
    t = dict(t)
    _check(bool(t.get("name")), f"config.tasks[{i}].name", t.get("name"), "name the task")
    examples = data.load_task(
      t["name"],
      t.get("split", "test"),
      limit=t.get("limit"),
      task_config=dict(t["task_config"]) if t.get("task_config") else None,
      data_dir=t.get("data_dir"),
      source_dir=t.get("source_dir"),
      on_bad_row=t.get("on_bad_row") or "raise",
    )
    specs.append(TaskSpec(t.get("label") or t["name"], t["name"], examples))
  return evaluate_tasks(
    model,
    None,
    tokenizer,
    specs,
    key=jax.random.key(int(config.get("seed", 0))),
    out_dir=os.path.join(workdir, "eval"),
    num_samples=config.num_samples,
    temperature=float(config.get("temperature", 0.6)),
    top_p=float(config.get("top_p", 1.0)),
    max_new_tokens=config.max_new_tokens,
    batch_size=config.batch_size,
    ks=tuple(config.get("ks", (1,))),
    greedy=bool(config.get("greedy", True)),
    progress=bool(config.get("progress", True)),
    run_info={"model": dict(config.model)},
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--source", default="default", choices=MODEL_SOURCES)
  parser.add_argument("--path", default="")
  parser.add_argument("--task", default="reasoning_gym/chain_sum")
  parser.add_argument("--split", default="test")
  parser.add_argument("--limit", type=int, default=16)
  parser.add_argument("--num_samples", type=int, default=8)
  parser.add_argument("--temperature", type=float, default=0.6)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--ks", default="1,2,4,8")
  args = parser.parse_args(argv)
  config = default_config()
  config.model.source, config.model.path = args.source, args.path
  config.tasks[0].update(name=args.task, split=args.split, limit=args.limit)
  if not args.task.endswith("chain_sum"):
    config.tasks[0]["task_config"] = None
  for field in ("num_samples", "temperature", "max_new_tokens", "batch_size", "seed"):
    setattr(config, field, getattr(args, field))
  config.ks = tuple(int(k) for k in args.ks.split(","))
  t0 = time.perf_counter()
  run(config, args.workdir)
  with open(os.path.join(args.workdir, "eval", "table.md")) as f:
    print(f.read())
  print(f"total {time.perf_counter() - t0:.1f} s (model load included)")


if __name__ == "__main__":
  main()
