"""What the files of a run directory say, read for `experiments.reports.report`: the `Run` record,
the run directories a list of workdirs stands for (a demo's subdirectories, a sequential run's
stages), labels, and each task's per-problem evaluation records with standard errors over
problems (the files and their meaning: `experiments.reports.report`'s module docstring).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from es_jax.metrics import maj_at_k, pass_at_k
from experiments.evaluation import results as eval_results
from experiments.infra.logger import METRICS_FILE, read_metrics
from experiments.schema.errors import ConfigError

METHOD_LABELS = {"es": "ES", "grpo": "GRPO", "evaluate": "base"}
ORDER_LABELS = {"grpo_es": "GRPO→ES", "es_grpo": "ES→GRPO"}
STAGE_DIR = re.compile(r"^stage(\d+)_(\w+)$")
# The order a demo's subdirectories are reported in; other names follow, sorted.
DEMO_ORDER = ("base", "es", "es_coverage", "grpo", "grpo_es", "es_grpo")
NA = "n/a"


@dataclasses.dataclass
class Run:
  """What the files of one run directory say."""

  name: str
  path: str
  config: dict[str, Any] | None = None
  stage: str | None = None  # the `stage` label of a sequential run's stage subdirectory
  tasks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  eval_missing: str | None = None
  rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  diversity: dict[str, Any] | None = None
  eval_seconds: float | None = None
  # task label -> {metric: per-problem values in problem-index order}, for paired differences
  per_problem: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)


def split_list(value: Any) -> list[str]:
  if isinstance(value, str):
    return [v.strip() for v in value.split(",") if v.strip()]
  return [str(v).strip() for v in value or () if str(v).strip()]


def _is_run(path: str) -> bool:
  return any(os.path.exists(os.path.join(path, f)) for f in ("eval", METRICS_FILE, "config.json"))


def expand(workdirs: Sequence[str]) -> list[str]:
  """The run directories `workdirs` stand for (module docstring), in order.

  Raises:
    ValueError: a workdir does not exist, or holds no run.
  """
  out = []
  for w in workdirs:
    if not os.path.isdir(w):
      raise ConfigError(f"config.report.workdirs: {w!r} is not a directory.")
    if _is_run(w) or _stage_of(w):
      out.append(w)
      continue
    subs = [s for s in os.listdir(w) if os.path.isdir(os.path.join(w, s))]
    subs = [s for s in subs if _is_run(os.path.join(w, s))]
    if not subs:
      raise ConfigError(
        f"config.report.workdirs: {w!r} holds no run (no eval/, {METRICS_FILE} or config.json, "
        "in it or in a subdirectory)."
      )
    rank = {n: i for i, n in enumerate(DEMO_ORDER)}
    subs.sort(key=lambda s: (rank.get(s, len(rank)), s))
    out += [os.path.join(w, s) for s in subs]
  return out


def _stage_of(path: str) -> str | None:
  """The `stage` label ("1_grpo") of a sequential run's stage subdirectory, else None."""
  m = STAGE_DIR.match(os.path.basename(os.path.normpath(path)))
  parent = os.path.dirname(os.path.normpath(path))
  if m and os.path.exists(os.path.join(parent, METRICS_FILE)):
    return f"{m.group(1)}_{m.group(2)}"
  return None


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}).") from None


def default_name(run: Run) -> str:
  """ES, GRPO, GRPO→ES, ... from the run's config; base for an evaluation; else the dir name."""
  base = os.path.basename(os.path.normpath(run.path))
  c = run.config or {}
  if run.stage:
    return f"{default_name(Run('', os.path.dirname(os.path.normpath(run.path)), c))} {run.stage}"
  if c.get("method") == "sequential":
    return ORDER_LABELS.get((c.get("sequential") or {}).get("order"), base)
  if c.get("method") in METHOD_LABELS:
    return METHOD_LABELS[c["method"]]
  return base


def load_run(path: str, name: str | None = None) -> Run:
  """Reads one run directory (or a sequential run's stage subdirectory)."""
  stage = _stage_of(path)
  root = os.path.dirname(os.path.normpath(path)) if stage else path
  run = Run(name=name or "", path=path, stage=stage)
  if os.path.exists(os.path.join(root, "config.json")):
    run.config = _read_json(os.path.join(root, "config.json"))
  if os.path.exists(os.path.join(root, METRICS_FILE)):
    run.rows = read_metrics(os.path.join(root, METRICS_FILE))
    if stage:
      run.rows = [r for r in run.rows if r.get("stage") == stage]
  attach_diversity(run, root)
  if stage:
    run.eval_missing = "a stage of a sequential run: the final evaluation is its parent's"
  else:
    _load_eval(run, os.path.join(path, "eval"))
  run.name = name or default_name(run)
  return run


def attach_diversity(run: Run, study_dir: str) -> None:
  """The ES population's row of `study_dir`/diversity/table.json, if there is one, into `run`."""
  div = os.path.join(study_dir, "diversity", "table.json")
  if os.path.exists(div):
    rows = [r for r in _read_json(div).get("rows", []) if r.get("kind") == "es"]
    run.diversity = rows[0] if rows else run.diversity


def diversity_target(path: str) -> str | None:
  """The run a `method=diversity` workdir measured (its `diversity.run`), else None."""
  config_path = os.path.join(path, "config.json")
  if _stage_of(path) or not os.path.exists(config_path):
    return None
  c = _read_json(config_path)
  if c.get("method") != "diversity":
    return None
  target = str((c.get("diversity") or {}).get("run") or "")
  if not target:
    raise ValueError(f"{config_path}: a method=diversity run without diversity.run.")
  return target


def same_dir(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def names_by_path(names: list[str], paths: list[str]) -> list[str | None]:
  """One label (or None: the default) per path, from `names` (module docstring)."""
  pairs = [n for n in names if "=" in n]
  if not pairs:
    if names and len(names) != len(paths):
      raise ConfigError(
        f"config.report.names: {len(names)} names for {len(paths)} runs ({', '.join(paths)}); "
        "give one name per run, or dir=label pairs, or none."
      )
    return list(names) or [None] * len(paths)
  if len(pairs) != len(names):
    raise ConfigError(
      f"config.report.names: {names} mixes labels and dir=label pairs; use one form."
    )
  out: list[str | None] = [None] * len(paths)
  for pair in pairs:
    key, label = (s.strip() for s in pair.split("=", 1))
    hits = [
      i
      for i, p in enumerate(paths)
      if key == os.path.basename(os.path.normpath(p)) or same_dir(key, p)
    ]
    if len(hits) != 1 or not label:
      found = [os.path.basename(os.path.normpath(p)) for p in paths]
      why = "an empty label" if not label else f"{len(hits)} runs match {key!r}"
      raise ConfigError(f"config.report.names: {pair!r}: {why}; the runs are {found}.")
    out[hits[0]] = label
  return out


def stem(label: str) -> str:
  return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


def _load_eval(run: Run, eval_dir: str) -> None:
  table_path = os.path.join(eval_dir, eval_results.TABLE_JSON)
  if not os.path.exists(table_path):
    partial = os.path.isdir(eval_dir) and any(f.endswith(".jsonl") for f in os.listdir(eval_dir))
    run.eval_missing = (
      "evaluation unfinished (records but no eval/table.json)" if partial else "no eval/"
    )
    return
  table = _read_json(table_path)
  for label, saved in table.get("tasks", {}).items():
    jsonl = os.path.join(eval_dir, stem(label) + ".jsonl")
    m = int(saved["num_problems"])
    records = [r for r in eval_results.read_records(jsonl) if r["index"] < m]
    if len(records) != m:
      raise ValueError(
        f"{jsonl}: {len(records)} problem records, but {table_path} summarises {m}; rerun the "
        "evaluation."
      )
    records.sort(key=lambda r: r["index"])
    ks = sorted(int(k.split("@")[1]) for k in saved if k.startswith("pass@"))
    meta_path = os.path.join(eval_dir, stem(label) + ".meta.json")
    meta = _read_json(meta_path) if os.path.exists(meta_path) else {}
    votes = eval_results.has_votes(meta.get("task"))
    run.tasks[label] = {**task_metrics(records, ks, votes=votes), "meta": meta}
    run.per_problem[label] = per_problem_values(records, ks)
  timing = eval_results.read_timing(eval_dir)
  run.eval_seconds = sum(timing.values()) if timing else None


def standard_error(values: np.ndarray) -> float:
  """Standard error of the mean of per-problem values (NaN for fewer than two)."""
  return float(np.std(values, ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.nan


def per_problem_values(records: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
  """{"index": problem indices, "greedy", "pass@k": per-problem values} of sorted records."""
  n = np.array([r["n"] for r in records], np.int64)
  c = np.array([r["c"] for r in records], np.int64)
  out = {"index": np.array([r["index"] for r in records], np.int64)}
  if records and all("greedy_correct" in r for r in records):
    out["greedy"] = np.array([float(r["greedy_correct"]) for r in records])
  for k in eval_results.usable_ks(ks, int(n.min())) if records else ():
    out[f"pass@{k}"] = np.asarray(pass_at_k(n, c, k), np.float64)
  return out


def task_metrics(
  records: Sequence[dict[str, Any]], ks: Sequence[int], votes: bool = True
) -> dict[str, Any]:
  """The summary of `eval_results.summarize` (`votes`: as there) plus "<metric>_se" standard
  errors over problems."""
  out = eval_results.summarize(records, ks=ks, votes=votes)
  n = np.array([r["n"] for r in records], np.int64)
  c = np.array([r["c"] for r in records], np.int64)
  if "greedy" in out:
    out["greedy_se"] = standard_error(np.array([float(r["greedy_correct"]) for r in records]))
  for k in eval_results.usable_ks(ks, int(n.min())):
    out[f"pass@{k}_se"] = standard_error(np.asarray(pass_at_k(n, c, k), np.float64))
    if votes:
      majority = [maj_at_k(r["answers"], k=k, correct=r["correct"]) for r in records]
      out[f"maj@{k}_se"] = standard_error(np.asarray(majority, np.float64))
  tokens = np.array([r["num_tokens"] for r in records], np.float64)
  ent = np.array([r["mean_entropy"] for r in records], np.float64)
  m = len(records)
  if m > 1 and tokens.sum() > 0:  # ratio estimator Σ t_i e_i / Σ t_i, linearised
    resid = tokens * (ent - out["mean_entropy"])
    out["mean_entropy_se"] = float(math.sqrt(m / (m - 1) * np.sum(resid**2)) / tokens.sum())
  else:
    out["mean_entropy_se"] = math.nan
  return out
