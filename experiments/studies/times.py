"""Time per unit of work of a study's stages, against study v1's measured rates
(docs/results/fair_study.md): evaluation seconds per 1,000 samples, ES seconds per 256 training
completions, GRPO seconds per step. Read from the run directories' files: an evaluation's
eval/timing.jsonl and its problems x (n + 1 greedy) samples; a training run's metrics.jsonl wall
times (the median gap between consecutive steps, so a stop and resume does not count).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from experiments.evaluation import results as eval_results
from experiments.infra.logger import read_metrics

# Study v1 (docs/results/fair_study.md): evaluation 8-11 min per 128 x 16 = 2,048 samples; ES
# 1.85 min per step of 16 members x 16 prompts = 256 greedy completions; GRPO 2.2 min per step.
V1 = {"eval": (8 * 60 / 2.048, 11 * 60 / 2.048), "es": (111.0, 111.0), "grpo": (132.0, 132.0)}


def step_seconds(run_dir: str) -> float | None:
  """Median wall seconds between consecutive training steps of a run, None without two."""
  rows = [r for r in read_metrics(run_dir) if "time" in r and r.get("step", 0) > 0]
  by_step = {int(r["step"]): float(r["time"]) for r in rows}
  steps = sorted(by_step)
  gaps = [by_step[b] - by_step[a] for a, b in zip(steps, steps[1:], strict=False) if b == a + 1]
  return float(np.median(gaps)) if gaps else None


def eval_rate(run_dir: str, problems: int, samples: int) -> float | None:
  """Evaluation seconds per 1,000 samples (problems x (n + 1)), None without timing."""
  seconds = sum(eval_results.read_timing(os.path.join(run_dir, "eval")).values())
  return 1000 * seconds / (problems * (samples + 1)) if seconds else None


def rates(runs: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list[float]]:
  """{"eval", "es", "grpo"}: the rates of the module docstring over `runs` (name -> (run dir,
  its config dict))."""
  out: dict[str, list[float]] = {"eval": [], "es": [], "grpo": []}
  for run_dir, c in runs.values():
    ev = eval_rate(run_dir, int(c["eval"]["limit"]), int(c["eval"]["num_samples"]))
    if ev is not None:
      out["eval"].append(ev)
    method, step = c.get("method"), step_seconds(run_dir)
    if step is None or method not in ("es", "grpo"):
      continue
    if method == "es":
      completions = c["es"]["population_size"] * c["data"]["prompts_per_step"]
      step = step * 256 / completions
    out[method].append(step)
  return out


def markdown(runs: dict[str, tuple[str, dict[str, Any]]]) -> list[str]:
  """The stage-time section: this study's median rate per unit against study v1's."""
  units = {
    "eval": "evaluation s / 1,000 samples",
    "es": "ES s / 256 completions",
    "grpo": "GRPO s / step",
  }
  lines = [
    "## Time per unit of work",
    "",
    "| stage | this study (median, runs) | study v1 | ratio |",
  ]
  lines.append("|---|---|---|---|")
  for kind, values in rates(runs).items():
    low, high = V1[kind]
    v1 = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
    if not values:
      lines.append(f"| {units[kind]} | – | {v1} | – |")
      continue
    mid = float(np.median(values))
    ratio = f"{mid / high:.2f}" if low == high else f"{mid / high:.2f}-{mid / low:.2f}"
    lines.append(f"| {units[kind]} | {mid:.1f} ({len(values)}) | {v1} | {ratio} |")
  return [*lines, "", "Ratio: this study's rate over v1's (below 1: faster).", ""]
