"""Training facts and curves of a run from its metrics.jsonl, for `experiments.reports.report` and
the
runners' own plots: steps per stage, training minutes, the last drift, training reward over steps
and over completions generated, rollout entropy with its sampling temperature, and the PNGs
(reward.png, reward_samples.png, entropy.png).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from experiments.reports import plots
from experiments.reports.runs import METHOD_LABELS, NA, Run


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


def train_seconds(run: Run, key: str = "step_seconds") -> float | None:
  """Σ `key` (step_seconds, or compile_seconds: the compiling within them) over the logged steps
  (a resume keeps each step's line once), or None where no step logged it."""
  rows = _train_rows(run)
  values = [r[key] for r in rows if isinstance(r.get(key), float) and math.isfinite(r[key])]
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


REWARD_NOTE = (
  "T: the sampling temperature of the rewarded completions (ES fitness is often greedy, T=0; "
  "GRPO's rollouts are sampled at T=1): rewards at different T measure different things; "
  "compare trends, not levels."
)


def _reward_note(runs: Sequence[Run]) -> str | None:
  """REWARD_NOTE when the runs' training rewards come from more than one temperature."""
  temperatures = {t for run in runs if (t := rollout_temperatures(run))}
  mixed = len(temperatures) > 1 or any("→" in t for t in temperatures)
  return REWARD_NOTE if mixed else None


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
      run.name: f"{run.name} ({t})" if (t := rollout_temperatures(run)) else run.name
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
      note=ENTROPY_NOTE if entropy else _reward_note(runs),
    )
  return figures, notes
