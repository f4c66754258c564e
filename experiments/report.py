"""A report across runs: one table per evaluation task, Pareto and Pass@k plots, training curves.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/cmp \
        --config.method=report --config.report.workdirs=runs/demo/base,runs/es,runs/grpo \
        [--config.report.names=base,ES,GRPO | --config.report.names=es=ES,grpo=GRPO] \
        [--config.report.out=DIR]

Every number is read from the run directories' own files; nothing is re-run:

  eval/<label>.jsonl, .meta.json  per-problem records (experiments.eval_results): greedy, Pass@k for
                                  every k of eval/table.json, Maj@k, token entropy of the samples
                                  at the evaluation temperature, each with its standard error
  eval/timing.jsonl               evaluation seconds, summed over resumed segments
  metrics.jsonl                   steps (per stage for sequential runs), Σ step_seconds (training
                                  minutes, each step once after a resume), the last `drift`,
                                  training reward (`train/reward`; ES `fitness/mean`, GRPO
                                  `reward/mean` in runs that predate it) over steps and over
                                  `train/samples`, rollout entropy (`entropy/mean`) over steps
  diversity/table.json            JS_succ of the ES population (experiments.diversity)
  config.json                     method, order and settings

A `method=diversity` workdir among the workdirs is not a row: its diversity/table.json is the
JS_succ of the run its `diversity.run` names (which must be among the runs), so a study need not
be copied into the run it measured.

`names` is either one label per run, in the order the runs are found (printed in the report's
settings), or `dir=label` pairs keyed by a run's directory name (or path); runs not named keep
their default label (ES, GRPO, GRPO→ES, ... from their configs).

A workdir that is not itself a run (no eval/, metrics.jsonl or config.json), e.g. a demo's, stands
for the runs in its subdirectories; a sequential run's `stage<i>_<method>` subdirectory stands for
that stage's rows of its parent's metrics (the final evaluation belongs to the parent). A missing
piece shows as "n/a" and the report says why.

Standard errors are over problems: s/√m for the m per-problem estimates (Pass@k's unbiased
per-problem value, greedy and Maj@k's 0/1), the binomial SE for 0/1 values; the token-weighted
entropy uses the delta-method SE of a ratio. Written into `report.out` (default WORKDIR/report):
report.md, pareto.png, pass_at_k.png (one of each per task when several tasks were evaluated),
reward.png, reward_samples.png and entropy.png when a run logged them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from es_jax.metrics import maj_at_k, pass_at_k
from experiments import eval_results, plots
from experiments.logger import METRICS_FILE, read_metrics

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


def _split(value: Any) -> list[str]:
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
      raise ValueError(f"config.report.workdirs: {w!r} is not a directory.")
    if _is_run(w) or _stage_of(w):
      out.append(w)
      continue
    subs = [s for s in os.listdir(w) if os.path.isdir(os.path.join(w, s))]
    subs = [s for s in subs if _is_run(os.path.join(w, s))]
    if not subs:
      raise ValueError(
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
  _attach_diversity(run, root)
  if stage:
    run.eval_missing = "a stage of a sequential run: the final evaluation is its parent's"
  else:
    _load_eval(run, os.path.join(path, "eval"))
  run.name = name or default_name(run)
  return run


def _attach_diversity(run: Run, study_dir: str) -> None:
  """The ES population's row of `study_dir`/diversity/table.json, if there is one, into `run`."""
  div = os.path.join(study_dir, "diversity", "table.json")
  if os.path.exists(div):
    rows = [r for r in _read_json(div).get("rows", []) if r.get("kind") == "es"]
    run.diversity = rows[0] if rows else run.diversity


def _diversity_target(path: str) -> str | None:
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


def _same_dir(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def _names_by_path(names: list[str], paths: list[str]) -> list[str | None]:
  """One label (or None: the default) per path, from `names` (module docstring)."""
  pairs = [n for n in names if "=" in n]
  if not pairs:
    if names and len(names) != len(paths):
      raise ValueError(
        f"config.report.names: {len(names)} names for {len(paths)} runs ({', '.join(paths)}); "
        "give one name per run, or dir=label pairs, or none."
      )
    return list(names) or [None] * len(paths)
  if len(pairs) != len(names):
    raise ValueError(
      f"config.report.names: {names} mixes labels and dir=label pairs; use one form."
    )
  out: list[str | None] = [None] * len(paths)
  for pair in pairs:
    key, label = (s.strip() for s in pair.split("=", 1))
    hits = [
      i
      for i, p in enumerate(paths)
      if key == os.path.basename(os.path.normpath(p)) or _same_dir(key, p)
    ]
    if len(hits) != 1 or not label:
      found = [os.path.basename(os.path.normpath(p)) for p in paths]
      why = "an empty label" if not label else f"{len(hits)} runs match {key!r}"
      raise ValueError(f"config.report.names: {pair!r}: {why}; the runs are {found}.")
    out[hits[0]] = label
  return out


def _stem(label: str) -> str:
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
    jsonl = os.path.join(eval_dir, _stem(label) + ".jsonl")
    m = int(saved["num_problems"])
    records = [r for r in eval_results.read_records(jsonl) if r["index"] < m]
    if len(records) != m:
      raise ValueError(
        f"{jsonl}: {len(records)} problem records, but {table_path} summarises {m}; rerun the "
        "evaluation."
      )
    records.sort(key=lambda r: r["index"])
    ks = sorted(int(k.split("@")[1]) for k in saved if k.startswith("pass@"))
    meta_path = os.path.join(eval_dir, _stem(label) + ".meta.json")
    meta = _read_json(meta_path) if os.path.exists(meta_path) else {}
    run.tasks[label] = {**task_metrics(records, ks), "meta": meta}
    run.per_problem[label] = per_problem_values(records, ks)
  timing = eval_results.read_timing(eval_dir)
  run.eval_seconds = sum(timing.values()) if timing else None


def _se(values: np.ndarray) -> float:
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


def difference_table(runs: Sequence[Run], label: str, notes: list[str]) -> list[str]:
  """Each run minus the first (the reference, e.g. the base model) on the same problems:
  mean difference ± its paired standard error over problems (markdown lines; [] if n/a)."""
  ref = runs[0] if runs and label in runs[0].per_problem else None
  others = [r for r in runs[1:] if label in r.per_problem]
  if ref is None or not others:
    return []
  metrics = ["greedy", *[f"pass@{k}" for k in _ks(runs, label)]]
  metrics = [m for m in metrics if all(m in r.per_problem[label] for r in (ref, *others))]
  head = ["difference", *[("Δ " + m).replace("pass", "Pass") for m in metrics]]
  lines = [f"Difference from {ref.name} on the same problems (mean ± paired standard error):", ""]
  lines += eval_results.markdown_header(head)
  for run in others:
    a, b = ref.per_problem[label], run.per_problem[label]
    if not np.array_equal(a["index"], b["index"]):
      notes.append(f"{run.name}: {label} differences: other problems than {ref.name}'s.")
      continue
    cells = [f"{run.name} − {ref.name}"]
    for m in metrics:
      d = b[m] - a[m]
      se = _se(d)
      cells.append(f"{d.mean():+.3f}" + (f" ± {se:.3f}" if math.isfinite(se) else ""))
    lines.append(eval_results.markdown_row(cells))
  return lines + [""]


def task_metrics(records: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
  """The summary of `eval_results.summarize` plus "<metric>_se" standard errors over problems."""
  out = eval_results.summarize(records, ks=ks)
  n = np.array([r["n"] for r in records], np.int64)
  c = np.array([r["c"] for r in records], np.int64)
  if "greedy" in out:
    out["greedy_se"] = _se(np.array([float(r["greedy_correct"]) for r in records]))
  for k in eval_results.usable_ks(ks, int(n.min())):
    out[f"pass@{k}_se"] = _se(np.asarray(pass_at_k(n, c, k), np.float64))
    votes = [maj_at_k(r["answers"], k=k, correct=r["correct"]) for r in records]
    out[f"maj@{k}_se"] = _se(np.asarray(votes, np.float64))
  tokens = np.array([r["num_tokens"] for r in records], np.float64)
  ent = np.array([r["mean_entropy"] for r in records], np.float64)
  m = len(records)
  if m > 1 and tokens.sum() > 0:  # ratio estimator Σ t_i e_i / Σ t_i, linearised
    resid = tokens * (ent - out["mean_entropy"])
    out["mean_entropy_se"] = float(math.sqrt(m / (m - 1) * np.sum(resid**2)) / tokens.sum())
  else:
    out["mean_entropy_se"] = math.nan
  return out


# --- training facts from metrics.jsonl ---


def _train_rows(run: Run) -> list[dict[str, Any]]:
  return [r for r in run.rows if r["step"] > 0 and "step_seconds" in r]


def steps_cell(run: Run) -> tuple[str, str | None]:
  """(cell, why n/a): the steps logged, "a+b" per stage for a sequential run."""
  rows = _train_rows(run)
  if not rows:
    return NA, "no training steps in metrics.jsonl" if run.rows else "no metrics.jsonl"
  stages: dict[Any, int] = {}
  for r in rows:
    stages[r.get("stage")] = stages.get(r.get("stage"), 0) + 1
  if len(stages) > 1:
    return "+".join(str(v) for v in stages.values()), None
  return str(len(rows)), None


def train_seconds(run: Run) -> float | None:
  """Σ step_seconds over the logged steps (a resume keeps each step's line once), or None."""
  rows = _train_rows(run)
  values = [r["step_seconds"] for r in rows if math.isfinite(r["step_seconds"])]
  return float(sum(values)) if values else None


def last_value(run: Run, key: str) -> float | None:
  values = [r[key] for r in run.rows if isinstance(r.get(key), float) and math.isfinite(r[key])]
  return values[-1] if values else None


def series(run: Run, key: str) -> list[list[float]] | None:
  pts = [
    (r["step"], r[key])
    for r in run.rows
    if isinstance(r.get(key), int | float) and math.isfinite(r[key])
  ]
  return (list(map(list, zip(*pts, strict=True)))) if pts else None


# Training reward: the name both runners log; runs logged before it have the per-method names.
REWARD_KEYS = ("train/reward",)
LEGACY_REWARD_KEYS = ("fitness/mean", "reward/mean")


def reward_series(run: Run, x_key: str | None = None) -> list[list[float]] | None:
  """(steps, or `x_key` values, e.g. train/samples; training reward) of a run, None if absent."""
  for key in REWARD_KEYS + LEGACY_REWARD_KEYS:
    if x_key is None:
      if (s := series(run, key)) is not None:
        return s
      continue
    pts = [
      (r[x_key], r[key])
      for r in run.rows
      if isinstance(r.get(key), int | float) and math.isfinite(r[key]) and x_key in r
    ]
    if pts:
      return list(map(list, zip(*pts, strict=True)))
  return None


def stage_boundaries(run: Run) -> list[float]:
  """Steps halfway between a sequential run's stages (where one method hands over)."""
  staged = [(r["step"], r["stage"]) for r in run.rows if r.get("stage") and r["step"] > 0]
  return [
    (a + b) / 2 for (a, s), (b, t) in zip(staged, staged[1:], strict=False) if s != t and b > a
  ]


# Training reward curves: debiased EMA with this decay over the faint raw per-step values.
REWARD_EMA = 0.6
ENTROPY_NOTE = (
  "T: the rollouts' sampling temperature (ES fitness is often greedy, T=0; GRPO samples at T=1); "
  "entropies at different T are not comparable."
)


def rollout_temperatures(run: Run) -> str | None:
  """The sampling temperature of a run's training rollouts: "T=0", "GRPO T=1 → ES T=0" for a
  sequential run, None when its config does not say."""
  c = run.config or {}

  def temp(method: str) -> str:
    t = (c.get(method) or {}).get("temperature")
    return "?" if t is None else f"{float(t):g}"

  method = c.get("method")
  if method in ("es", "grpo"):
    return f"T={temp(method)}"
  if method != "sequential":
    return None
  if run.stage:  # "1_grpo"
    return f"T={temp(run.stage.split('_', 1)[1])}"
  order = str((c.get("sequential") or {}).get("order", "")).split("_")
  return " → ".join(f"{METHOD_LABELS.get(m, m)} T={temp(m)}" for m in order)


def training_curves(runs: Sequence[Run], out: str) -> tuple[dict[str, str], list[str]]:
  """reward.png (training reward over steps: debiased EMA over the faint raw values, stage
  boundaries dotted), reward_samples.png (over completions generated: equal compute for ES and
  GRPO) and entropy.png (rollout token entropy, each curve labelled with its sampling
  temperature) in `out`, one line per run; returns ({name: path}, notes on what no run
  logged)."""
  figures: dict[str, str] = {}
  notes: list[str] = []
  for name, get, ylabel, xlabel, what in (
    (
      "reward",
      reward_series,
      "mean training reward",
      "step",
      "training reward (train/reward), EMA",
    ),
    (
      "reward_samples",
      lambda run: reward_series(run, "train/samples"),
      "mean training reward",
      "completions generated (train/samples)",
      "training reward at equal compute",
    ),
    (
      "entropy",
      lambda run: series(run, "entropy/mean"),
      "rollout token entropy (nats)",
      "step",
      "token entropy of the training rollouts",
    ),
  ):
    entropy = name == "entropy"
    labels = {
      run.name: f"{run.name} ({t})" if entropy and (t := rollout_temperatures(run)) else run.name
      for run in runs
    }
    curves = {labels[run.name]: s for run in runs if (s := get(run)) is not None}
    if not curves:
      notes.append(f"{what}: n/a (no run logged it).")
      continue
    marks = {}
    if xlabel == "step":
      marks = {
        labels[r.name]: b for r in runs if labels[r.name] in curves and (b := stage_boundaries(r))
      }
    figures[name] = plots.plot_metric_over_steps(
      curves,
      os.path.join(out, f"{name}.png"),
      ylabel=ylabel,
      xlabel=xlabel,
      title=what,
      boundaries=marks,
      ema=None if entropy else REWARD_EMA,
      note=ENTROPY_NOTE if entropy else None,
    )
  return figures, notes


# --- the report ---


def _fmt(value: float | None, se: float | None = None, digits: int = 3) -> str:
  if value is None or not math.isfinite(value):
    return NA
  text = f"{value:.{digits}f}"
  if se is not None and math.isfinite(se):
    text += f" ± {se:.{digits}f}"
  return text


def _labels(runs: Sequence[Run]) -> list[str]:
  """Every task label evaluated by some run, in first-seen order."""
  out: list[str] = []
  for run in runs:
    out += [t for t in run.tasks if t not in out]
  return out


def _ks(runs: Sequence[Run], label: str) -> list[int]:
  ks: set[int] = set()
  for run in runs:
    if label in run.tasks:
      ks |= {int(k.split("@")[1]) for k in run.tasks[label] if re.fullmatch(r"pass@\d+", k)}
  return sorted(ks)


def task_table(runs: Sequence[Run], label: str, notes: list[str]) -> list[str]:
  """The markdown lines of one task's table (one row per run)."""
  ks = _ks(runs, label)
  head = ["method", "steps", "greedy", *[f"Pass@{k}" for k in ks], *[f"Maj@{k}" for k in ks]]
  head += ["entropy (nats)", "drift", "JS_succ [95% CI]", "train min", "eval min"]
  lines = eval_results.markdown_header(head)
  for run in runs:
    t = run.tasks.get(label)
    steps, why = steps_cell(run)
    if why:
      notes.append(f"{run.name}: steps, train min: {why}.")
    cells = [run.name, steps]
    if t is None:
      why = run.eval_missing or f"task {label} not evaluated"
      notes.append(f"{run.name}: {label} metrics: {why}.")
      cells += [NA] * (1 + 2 * len(ks) + 1)
    else:
      cells.append(_fmt(t.get("greedy"), t.get("greedy_se")))
      for kind in ("pass", "maj"):
        cells += [_fmt(t.get(f"{kind}@{k}"), t.get(f"{kind}@{k}_se")) for k in ks]
      absent = [k for k in ks if f"pass@{k}" not in t]
      if absent:
        notes.append(f"{run.name}: {label} Pass@k, Maj@k for k = {absent}: not in its eval.ks.")
      cells.append(_fmt(t.get("mean_entropy"), t.get("mean_entropy_se")))
    drift = last_value(run, "drift")
    if drift is None:
      notes.append(f"{run.name}: drift: {'not in' if run.rows else 'no'} metrics.jsonl.")
    cells.append(_fmt(drift, digits=4) if drift is not None else NA)
    if run.diversity is not None:
      d = run.diversity
      cells.append(eval_results.interval_cell(d["js_succ"], d.get("js_succ_ci")))
    else:
      cells.append(NA)
      notes.append(f"{run.name}: JS_succ: no diversity/table.json (method=diversity) in the run.")
    train = train_seconds(run)
    cells.append(_fmt(train / 60, digits=1) if train is not None else NA)
    if run.eval_seconds is None and t is not None:
      notes.append(f"{run.name}: eval min: no eval/timing.jsonl (an older evaluation).")
    cells.append(_fmt(run.eval_seconds / 60, digits=1) if run.eval_seconds is not None else NA)
    lines.append(eval_results.markdown_row(cells))
  return lines


def _settings(run: Run) -> str:
  c = run.config or {}
  parts = [f"`{run.path}`"]
  if c:
    parts.append(f"method {c.get('method')}, seed {c.get('seed')}")
    model = c.get("model") or {}
    parts.append(f"model {model.get('source')} {model.get('path') or model.get('preset') or ''}")
    method = c.get("method")
    es_cfg, grpo_cfg = c.get("es") or {}, c.get("grpo") or {}
    if method in ("es", "sequential") and es_cfg:
      rank = f"rank {es_cfg.get('rank')}" if es_cfg.get("rank") else "full rank"
      parts.append(
        f"ES N = {es_cfg.get('population_size')}, σ = {es_cfg.get('sigma')}, "
        f"α = {es_cfg.get('learning_rate')}, {rank}, fitness at T = {es_cfg.get('temperature')}"
      )
    if method in ("grpo", "sequential") and grpo_cfg:
      parts.append(
        f"GRPO G = {grpo_cfg.get('num_generations')}, lr = {grpo_cfg.get('learning_rate')}, "
        f"β = {grpo_cfg.get('beta')}"
      )
  else:
    parts.append("no config.json")
  for label, t in run.tasks.items():
    meta = t.get("meta") or {}
    parts.append(
      f"eval {label}: {t['num_problems']} problems, n = {t['num_samples']} at T = "
      f"{meta.get('temperature', NA)}, ≤ {meta.get('max_new_tokens', NA)} new tokens"
    )
  return f"- {run.name}: " + "; ".join(parts) + "."


def build(
  workdirs: Sequence[str],
  out: str,
  *,
  names: Sequence[str] = (),
  title: str = "Run comparison",
  intro: Sequence[str] = (),
) -> dict[str, Any]:
  """Reads the runs, writes report.md and the PNGs into `out`.

  Args:
    workdirs: run directories (or directories of runs, module docstring).
    out: the output directory (created).
    names: one label per run found (default: from each run's config).
    title: the report's heading.
    intro: markdown lines after the heading.

  Returns:
    {"report": report.md path, "figures": {name: png path}, "runs": {name: {task: metrics}},
    "notes": the reasons for every n/a}.

  Raises:
    ValueError: naming the field or file: bad workdirs, names, or unreadable records.
  """
  paths = expand(_split(workdirs))
  studies = {p: t for p in paths if (t := _diversity_target(p)) is not None}
  paths = [p for p in paths if p not in studies]
  if not paths:
    raise ValueError(f"config.report.workdirs: {workdirs!r} holds only diversity studies.")
  labels = _names_by_path(_split(names), paths)
  runs = [load_run(p, label) for p, label in zip(paths, labels, strict=True)]
  for study, target in studies.items():
    hits = [r for r in runs if not r.stage and _same_dir(r.path, target)]
    if not hits:
      raise ValueError(
        f"config.report.workdirs: the diversity study {study!r} measured {target!r}, which is "
        "not among the runs; add it to the workdirs."
      )
    _attach_diversity(hits[0], study)
  seen: dict[str, int] = {}
  for run in runs:  # unique names: repeated default labels get their directory name
    seen[run.name] = seen.get(run.name, 0) + 1
  for run, label in zip(runs, labels, strict=True):
    if seen[run.name] > 1 and label is None:
      run.name = f"{run.name} ({os.path.basename(os.path.normpath(run.path))})"
  if len({r.name for r in runs}) != len(runs):
    raise ValueError(
      f"config.report.names: {[r.name for r in runs]} repeats a name; give unique names."
    )
  os.makedirs(out, exist_ok=True)
  figures: dict[str, str] = {}
  labels = _labels(runs)
  text = [f"# {title}", "", *intro]
  notes: list[str] = []
  for label in labels or [None]:
    suffix = "" if len(labels) <= 1 else f"_{_stem(label)}"
    if label is None:
      text += ["No run has a finished evaluation (eval/table.json).", ""]
      for run in runs:
        notes.append(f"{run.name}: evaluation: {run.eval_missing}.")
      break
    text += [f"## {label}" if len(labels) > 1 else f"## Evaluation: {label}", ""]
    text += task_table(runs, label, notes)
    text.append("")
    text += difference_table(runs, label, notes)
    evaluated = [r for r in runs if label in r.tasks]
    curves = {
      r.name: (r.tasks[label]["pass_at_k_curve"]["k"], r.tasks[label]["pass_at_k_curve"]["value"])
      for r in evaluated
    }
    if curves:
      figures[f"pass_at_k{suffix}"] = plots.plot_pass_at_k(
        curves, os.path.join(out, f"pass_at_k{suffix}.png"), title=f"Pass@k, {label}"
      )
    common = set.intersection(*(set(_ks([r], label)) for r in evaluated)) if evaluated else {1}
    big = max(common)  # the largest k every run evaluated (1 always is)
    points = {
      r.name: (
        r.tasks[label]["pass@1"],
        r.tasks[label][f"pass@{big}"],
        r.tasks[label]["pass@1_se"],
        r.tasks[label][f"pass@{big}_se"],
      )
      for r in evaluated
    }
    if points and big > 1:
      figures[f"pareto{suffix}"] = plots.plot_pareto(
        points,
        os.path.join(out, f"pareto{suffix}.png"),
        xlabel="Pass@1",
        ylabel=f"Pass@{big}",
        title=f"Pass@1 vs Pass@{big}, {label}",
      )
      front = plots.pareto_front({k: v[:2] for k, v in points.items()})
      text += [f"Pareto front (Pass@1, Pass@{big}): {', '.join(front)}.", ""]
    elif evaluated:
      notes.append(f"{label}: Pareto plot: n/a (Pass@1 only: n = 1 sample per problem).")
    for name in (f"pareto{suffix}", f"pass_at_k{suffix}"):
      if name in figures:
        text += [f"![{name}]({os.path.basename(figures[name])})", ""]
  curves, missing = training_curves(runs, out)
  figures.update(curves)
  text += [line for name in curves for line in (f"![{name}]({name}.png)", "")]
  notes += missing
  text += [
    "Values ± standard error over problems (module `experiments.report`). Pass@k: unbiased "
    "estimator over the n samples per problem; Maj@k: plurality vote of the first k answers; "
    "greedy: one temperature-0 sample; entropy: per generated token of the evaluation samples "
    "(drawn at the evaluation temperature; the model's untempered distribution), token-weighted. "
    "Drift: the last logged ‖θ−θ₀‖/‖θ₀‖. JS_succ: the ES population's success diversity "
    "(docs/method.md §6). Train min: Σ step_seconds of metrics.jsonl (each step once after a "
    "resume; periodic evaluations included, model loading not); eval min: the final "
    "evaluation's eval/timing.jsonl, summed over resumed segments.",
    "",
    "## Runs",
    "",
    *[_settings(r) for r in runs],
    "",
  ]
  if notes:
    text += ["## Not available", "", *[f"- {n}" for n in dict.fromkeys(notes)], ""]
  path = os.path.join(out, "report.md")
  eval_results.write_text(path, "\n".join(text))
  keep = ("greedy", "pass@", "maj@", "mean_entropy", "num_problems", "num_samples", "mean_length")
  summary = {
    r.name: {
      label: {k: v for k, v in t.items() if k.startswith(keep)} for label, t in r.tasks.items()
    }
    for r in runs
  }
  return {"report": path, "figures": figures, "runs": summary, "notes": list(dict.fromkeys(notes))}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="report"`: the report of `config.report.workdirs` into `report.out`."""
  r = config.report
  if not _split(r.workdirs):
    raise ValueError("config.report.workdirs is empty: name the run directories, comma-separated.")
  out = r.out or os.path.join(workdir, "report")
  return build(_split(r.workdirs), out, names=_split(r.names))
