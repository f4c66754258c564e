"""Population size sweep (docs/method.md §8): ES training reward for several N on one model.

    python -m experiments.main --config experiments/configs/gsm8k_easy.py --workdir gs://B/sweep \
        --config.method=population_sweep --config.population_sweep.sizes=8,16,32,64

Runs `experiments.runners.es_runner` once per N (sub-directories N=<n>/, each resumable; every other
setting from the config, final evaluation off unless `population_sweep.evaluate`), then reports each
run's training reward (population mean fitness) smoothed with a debiased exponential moving
average of decay `ema_decay` (0.99: `debiased_ema`), at the last step (update 300 in the
`:sweep` variants), and the smallest N whose smoothed reward is within `tolerance` of the largest
N's (the paper's criterion: 0.01 of N = 64). Writes sweep.json, sweep.md and sweep.png.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from experiments.infra.logger import read_metrics
from experiments.reports import curves as report_curves
from experiments.reports import plots
from experiments.reports import runs as report_runs
from experiments.runners import es_runner
from experiments.schema import check as config_check


def sizes_of(config: ml_collections.ConfigDict) -> list[int]:
  """The sweep's population sizes, ascending (a validated config: ints >= 2, config_check)."""
  return sorted({int(s) for s in str(config.population_sweep.sizes).split(",") if s.strip()})


def debiased_ema(values: Sequence[float], decay: float) -> np.ndarray:
  """Exponential moving average with Adam's bias correction, in float64:

      s_t = decay · s_{t-1} + (1 − decay) · r_t,   s_0 = 0,   ŝ_t = s_t / (1 − decay^t),

  t = 1, 2, ... counting the values given (one per logged step). ŝ_1 = r_1, and every ŝ_t is a
  weighted mean of r_1..r_t (weights ∝ decay^(t−j)), so early steps are not pulled towards 0."""
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"debiased_ema: decay={decay!r}; need 0 <= decay < 1.")
  out = np.empty(len(values), np.float64)
  s = 0.0
  for t, r in enumerate(np.asarray(values, np.float64), start=1):
    s = decay * s + (1.0 - decay) * r
    out[t - 1] = s / (1.0 - decay**t)
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  config_check.validate(config)
  sweep = config.population_sweep
  decay = float(sweep.ema_decay)  # checked by config_check: 0 <= decay < 1
  curves, final = {}, {}
  for n in sizes_of(config):
    sub = ml_collections.ConfigDict(config.to_dict())
    sub.method = "es"
    sub.es.population_size = n
    sub.eval.final = bool(sweep.evaluate)
    sub.lock()
    run_dir = os.path.join(workdir, f"N={n}")
    if not os.path.exists(os.path.join(run_dir, "DONE")):
      result = es_runner.run(sub, run_dir)
      if result.get("stopped"):
        return {"stopped": True}
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    run = report_runs.Run(f"N={n}", run_dir, rows=rows)
    steps, rewards = report_curves.reward_series(run) or ([], [])
    if not steps:
      raise ValueError(f"{run_dir}/metrics.jsonl: no training reward logged.")
    smooth = debiased_ema(rewards, decay)
    curves[f"N={n}"] = (steps, smooth)
    final[n] = float(smooth[-1])
  largest = max(final)
  within = [n for n in sorted(final) if final[n] >= final[largest] - float(sweep.tolerance)]
  result = {
    "smoothed_final_reward": final,
    "ema_decay": decay,
    "final_step": {n: curves[f"N={n}"][0][-1] for n in final},
    "tolerance": float(sweep.tolerance),
    "smallest_sufficient_N": within[0],
  }
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "sweep.json"), "w") as f:
    json.dump(result, f, indent=1)
  lines = ["| N | step | smoothed training reward |", "|---|---|---|"]
  lines += [f"| {n} | {result['final_step'][n]:g} | {v:.4f} |" for n, v in sorted(final.items())]
  lines += [
    "",
    f"Smallest N within {sweep.tolerance} of N = {largest}: {within[0]} "
    f"(debiased EMA of decay {decay:g}, at each run's last step).",
  ]
  with open(os.path.join(workdir, "sweep.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  plots.plot_metric_over_steps(
    {k: (x, np.asarray(y)) for k, (x, y) in curves.items()},
    os.path.join(workdir, "sweep.png"),
    ylabel=f"training reward (debiased EMA, decay {decay:g})",
    title="ES population size sweep",
  )
  return result
