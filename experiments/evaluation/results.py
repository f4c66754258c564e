"""Evaluation results: per-problem records, their jsonl and settings files, the table and plot.

The jsonl holds one record per problem (see `experiments.evaluation.evaluate`). It is appended one
line per
write and fsynced, so after a crash only the last line can be torn; `read_records` drops a torn or
unparsable last line (and with `repair`, cuts it from the file so the next append starts clean).
A bad line anywhere else is an error naming the file and line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from es_jax import rewards
from es_jax.metrics import maj_at_k, pass_at_k
from experiments.reports import plots
from experiments.schema.errors import ConfigError

log = logging.getLogger(__name__)
TABLE_MD, TABLE_JSON, PASS_AT_K_PNG = "table.md", "table.json", "pass_at_k.png"
TIMING_JSONL = "timing.jsonl"


def read_records(path: str, *, repair: bool = False) -> list[dict]:
  """Problem records of a jsonl file ([] if it does not exist), dropping a torn last line.

  Args:
    path: the jsonl file.
    repair: also truncate the file just before a torn last line.

  Raises:
    ValueError: a line other than the last is not a JSON object.
  """
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    raw = f.read()
  lines = raw.split(b"\n")
  keep = len(raw)
  if lines[-1] == b"":
    lines.pop()  # the newline ending the last record
  records = []
  for number, line in enumerate(lines, start=1):
    try:
      record = json.loads(line)
      if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    except ValueError as e:
      if number < len(lines):
        raise ValueError(
          f"{path}:{number}: not a valid record ({e}); fix or delete the file."
        ) from None
      log.warning("%s:%d: ignoring a torn last line (%d bytes)", path, number, len(line))
      keep = len(raw) - len(line) - (0 if not raw.endswith(b"\n") else 1)
      break
    records.append(record)
  if repair and keep < len(raw):
    with open(path, "r+b") as f:
      f.truncate(keep)
  return records


def file_stem(out_dir: str, label: str) -> str:
  """The path (without suffix) of task `label`'s files in `out_dir`: <stem>.jsonl, .meta.json."""
  return os.path.join(out_dir, re.sub(r"[^A-Za-z0-9._-]+", "_", label))


def open_records(path: str, meta_path: str, settings: dict, *, resume: bool) -> dict[int, dict]:
  """Checks (or writes) the settings file next to a jsonl; returns its records by problem index.

  Args:
    path: the jsonl file.
    meta_path: the settings file (JSON).
    settings: this run's settings; a resume with any difference is refused.
    resume: False deletes both files first.

  Raises:
    ConfigError: the saved settings differ (one line).
    ValueError: a jsonl exists without its settings file.
  """
  if not resume:
    for p in (path, meta_path):
      if os.path.exists(p):
        os.remove(p)
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      saved = json.load(f)
    diff = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if diff:
      changes = ", ".join(f"{k}: {saved.get(k)!r} -> {settings.get(k)!r}" for k in diff)
      raise ConfigError(
        f"{meta_path}: the saved evaluation used other settings ({changes}); rerun with the "
        "saved values, or add --config.eval.restart=True to start it over."
      )
  else:
    if os.path.exists(path) and os.path.getsize(path):
      raise ValueError(f"{path} exists without {meta_path}; cannot check its settings.")
    write_json(meta_path, settings)
  return {r["index"]: r for r in read_records(path, repair=True)}


def key_json(key) -> list[int]:
  """A PRNG key (typed or raw uint32) as the list of its words, for the settings file."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.asarray(key).reshape(-1).tolist()


def example_id(example: Mapping[str, Any], index: int):
  """The example's "id" as a JSON value (its index if it has none)."""
  value = example.get("id", index)
  if isinstance(value, bytes):
    return value.decode("utf-8", "replace")
  if isinstance(value, np.generic):
    return value.item()
  return value if isinstance(value, (str, int)) else str(value)


def make_record(index: int, example: Mapping[str, Any], scored: Mapping[str, Any]) -> dict:
  """One problem's jsonl record from its scored samples.

  Args:
    index: the problem's index in the task's examples.
    example: the example (for its id).
    scored: {"correct": [0/1] * n, "answers": [str | None] * n, "lengths": [int] * n,
      "entropy": summed token entropy of the n samples, optionally "greedy": (correct, answer,
      length) and "texts" / "greedy_text"}.
  """
  tokens = int(sum(scored["lengths"]))
  record = {
    "index": index,
    "id": example_id(example, index),
    "n": len(scored["correct"]),
    "c": int(sum(scored["correct"])),
    "correct": list(scored["correct"]),
    "answers": list(scored["answers"]),
    "mean_length": float(np.mean(scored["lengths"])),
    "mean_entropy": float(scored["entropy"]) / max(tokens, 1),
    "num_tokens": tokens,
  }
  if "greedy" in scored:
    correct, answer, length = scored["greedy"]
    record.update(greedy_correct=bool(correct), greedy_answer=answer, greedy_length=int(length))
  for field in ("texts", "greedy_text"):
    if field in scored:
      record[field] = scored[field]
  return record


def append_record(path: str, record: Mapping[str, Any]) -> None:
  """Appends one record as a single line, flushed and fsynced before returning."""
  line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
  with open(path, "ab") as f:
    f.write(line.encode("utf-8"))
    f.flush()
    os.fsync(f.fileno())


def append_timing(out_dir: str, label: str, *, seconds: float, problems: int) -> None:
  """Appends one evaluation segment's time to `out_dir/timing.jsonl` (a resume adds a line)."""
  append_record(
    os.path.join(out_dir, TIMING_JSONL),
    {"label": label, "seconds": float(seconds), "problems": int(problems)},
  )


def read_timing(out_dir: str) -> dict[str, float]:
  """Seconds per task label summed over the segments of `out_dir/timing.jsonl` ({} if none)."""
  out: dict[str, float] = {}
  for r in read_records(os.path.join(out_dir, TIMING_JSONL)):
    out[str(r.get("label"))] = out.get(str(r.get("label")), 0.0) + float(r.get("seconds", 0.0))
  return out


def write_text(path: str, text: str) -> None:
  """Writes `text` atomically (temporary file, fsync, then rename): a reader never sees half."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (`write_text`)."""
  write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def usable_ks(ks: Sequence[int], n: int) -> list[int]:
  """Sorted unique k ≤ n of `ks`, with 1 always included."""
  return sorted({1, *(int(k) for k in ks if 1 <= int(k) <= n)})


def has_votes(task: str | None) -> bool:
  """Whether the answers of task `task` (the name its samples are scored with) can vote: a
  built-in task extracts a normalised answer; a user's reward ("file.py:function") has none, so
  Maj@k is undefined there (None, shown "n/a"), not 0."""
  return not rewards.is_user_reward(task or "")


def summarize(
  records: Sequence[Mapping[str, Any]], *, ks: Sequence[int], votes: bool = True
) -> dict[str, Any]:
  """Task metrics from problem records: means over problems of the per-problem estimates.

  Args:
    records: the problems' records.
    ks: the k of Pass@k and Maj@k.
    votes: the answers can vote (`has_votes`); False: Maj@k is None (no gold answer to vote on).

  Returns:
    {"num_problems", "num_samples", "greedy" (if recorded), "pass@k" and "maj@k" for k in
    `usable_ks`, "mean_length" (mean over problems of the mean sample length, in tokens, EOS
    included), "mean_entropy" (per generated token, pooled over all samples), "pass_at_k_curve"
    ({"k": 1..n, "value": Pass@k})}.
  """
  if not records:
    raise ValueError("summarize: no problem records; evaluate at least one problem.")
  n = np.array([r["n"] for r in records], np.int64)
  c = np.array([r["c"] for r in records], np.int64)
  n_min = int(n.min())
  out: dict[str, Any] = {"num_problems": len(records), "num_samples": n_min}
  if all("greedy_correct" in r for r in records):
    out["greedy"] = float(np.mean([bool(r["greedy_correct"]) for r in records]))
  ks = usable_ks(ks, n_min)
  for k in ks:
    out[f"pass@{k}"] = float(np.mean(pass_at_k(n, c, k)))
  for k in ks:
    majority = [maj_at_k(r["answers"], k=k, correct=r["correct"]) for r in records] if votes else []
    out[f"maj@{k}"] = float(np.mean(majority)) if votes else None
  tokens = np.array([r["num_tokens"] for r in records], np.float64)
  entropy = np.array([r["mean_entropy"] for r in records], np.float64)
  out["mean_length"] = float(np.mean([r["mean_length"] for r in records]))
  out["mean_entropy"] = float(np.sum(entropy * tokens) / max(np.sum(tokens), 1.0))
  curve_k = list(range(1, n_min + 1))
  out["pass_at_k_curve"] = {
    "k": curve_k,
    "value": [float(np.mean(pass_at_k(n, c, k))) for k in curve_k],
  }
  return out


def macro(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
  """Unweighted mean over tasks of every float metric all tasks share, and of their curves."""
  if not summaries:
    raise ValueError("macro: no task summaries.")
  tasks = list(summaries.values())
  keys = [k for k, v in tasks[0].items() if isinstance(v, float) and all(k in t for t in tasks)]
  out: dict[str, Any] = {k: float(np.mean([t[k] for t in tasks])) for k in keys}
  for count in ("num_problems", "num_distinct", "num_seen_in_training"):
    if all(t.get(count) is not None for t in tasks):
      out[count] = int(sum(t[count] for t in tasks))
  curves = [t["pass_at_k_curve"] for t in tasks if "pass_at_k_curve" in t]
  if len(curves) == len(tasks):
    length = min(len(cv["k"]) for cv in curves)
    out["pass_at_k_curve"] = {
      "k": curves[0]["k"][:length],
      "value": [float(np.mean([cv["value"][i] for cv in curves])) for i in range(length)],
    }
  return out


def _columns(summary: Mapping[str, Any]) -> list[str]:
  def k_of(name):
    return int(name.split("@")[1])

  passes = sorted((k for k in summary if k.startswith("pass@")), key=k_of)
  majs = sorted((k for k in summary if k.startswith("maj@")), key=k_of)
  greedy = ["greedy"] if "greedy" in summary else []
  return ["num_problems", *greedy, *passes, *majs, "mean_length", "mean_entropy"]


def _cell(column: str, value: Any) -> str:
  if value is None:
    return "n/a"
  if column == "num_problems":
    return str(int(value))
  if column == "mean_length":
    return f"{value:.1f}"
  return f"{value:.3f}"


def markdown_row(cells: Sequence[Any]) -> str:
  """One markdown table row: ``| a | b | c |``."""
  return "| " + " | ".join(str(c) for c in cells) + " |"


def interval_cell(value: float | None, interval: Sequence[float] | None, digits: int = 4) -> str:
  """``value [lo, hi]`` (a statistic and its confidence interval), "–" without a value."""
  if value is None:
    return "–"
  lo, hi = interval or (math.nan, math.nan)
  return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def markdown_header(head: Sequence[Any]) -> list[str]:
  """A markdown table's header row and its ``|---|---|`` rule."""
  return [markdown_row(head), "|" + "---|" * len(head)]


def problems_line(summaries: Mapping[str, Mapping[str, Any]]) -> str:
  """'label: N problems, N distinct, 0 seen in training; ...' for the summaries that record
  their problem counts (experiments.evaluation.data); "" when none does."""
  parts = [
    f"{name}: {s['num_problems']} problems, {s['num_distinct']} distinct, "
    f"{s['num_seen_in_training']} seen in training"
    for name, s in summaries.items()
    if s.get("num_seen_in_training") is not None and "num_distinct" in s
  ]
  return "; ".join(parts)


def markdown_table(
  summaries: Mapping[str, Mapping[str, Any]],
  macro_row: Mapping[str, Any],
  averaged: Sequence[str] | None = None,
) -> str:
  """A markdown table: one row per task in `averaged` (default: all), their macro-average row,
  then the other tasks' rows, marked as not averaged."""
  averaged = list(summaries) if averaged is None else list(averaged)
  columns = _columns(next(iter(summaries.values())))
  head = {"num_problems": "problems", "mean_length": "length (tokens)", "mean_entropy": "entropy"}
  lines = markdown_header(["task", *(head.get(c, c) for c in columns)])
  separate = [name for name in summaries if name not in averaged]
  macro_name = "macro average" + (f" ({', '.join(averaged)})" if separate else "")
  rows = [(name, summaries[name]) for name in averaged] + [(macro_name, macro_row)]
  rows += [(f"{name} (not averaged)", summaries[name]) for name in separate]
  for name, s in rows:
    lines.append(markdown_row([name, *(_cell(c, s.get(c)) for c in columns)]))
  n = next(iter(summaries.values()))["num_samples"]
  lines.append("")
  lines += [f"Problems: {problems_line(summaries)}.", ""] if problems_line(summaries) else []
  lines.append(
    f"Pass@k: unbiased estimator over n = {n} samples per problem; Maj@k: plurality vote of the "
    "first k normalised answers (n/a: a user's reward extracts no answer to vote on); greedy: "
    "one temperature-0 sample. Length: generated tokens per sample (EOS included); entropy: "
    "mean full-distribution entropy per generated token (nats)."
  )
  return "\n".join(lines) + "\n"


def write_report(
  summaries: Mapping[str, Mapping[str, Any]], out_dir: str, averaged: Sequence[str] | None = None
) -> dict[str, str]:
  """Writes table.md, table.json and pass_at_k.png for the task summaries (plus the macro average
  over the tasks named in `averaged`, default all; table.json lists them as "macro_tasks").

  Returns:
    {"table_md", "table_json", "pass_at_k_png"} paths.
  """
  os.makedirs(out_dir, exist_ok=True)
  averaged = list(summaries) if averaged is None else list(averaged)
  macro_row = macro({name: summaries[name] for name in averaged})
  paths = {
    "table_md": os.path.join(out_dir, TABLE_MD),
    "table_json": os.path.join(out_dir, TABLE_JSON),
    "pass_at_k_png": os.path.join(out_dir, PASS_AT_K_PNG),
  }
  tasks = {name: dict(s) for name, s in summaries.items()}
  write_json(paths["table_json"], {"tasks": tasks, "macro": macro_row, "macro_tasks": averaged})
  write_text(paths["table_md"], markdown_table(summaries, macro_row, averaged))
  curves = {
    name: (s["pass_at_k_curve"]["k"], s["pass_at_k_curve"]["value"]) for name, s in tasks.items()
  }
  if len(curves) > 1 and "pass_at_k_curve" in macro_row:
    curves["macro average"] = (
      macro_row["pass_at_k_curve"]["k"],
      macro_row["pass_at_k_curve"]["value"],
    )
  plots.plot_pass_at_k(curves, paths["pass_at_k_png"], title="Pass@k")
  return paths


def one_line(summary: Mapping[str, Any]) -> str:
  """'greedy 0.420 pass@1 0.250 ...' for logs."""
  return " ".join(
    f"{k} {v:.3f}" for k, v in summary.items() if isinstance(v, float) and not k.startswith("mean_")
  )
