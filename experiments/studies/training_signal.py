"""A study's training signal: ES against its null control (shuffled fitness), step by step on
the same training batches, as the report's table (experiments/studies/fair_study.py, study_v2.py).
"""

from __future__ import annotations

import os

import numpy as np

from experiments.evaluation import results as eval_results
from experiments.reports import curves as report_curves
from experiments.reports import runs as report_runs
from experiments.studies import demo


def step_rewards(run_dir: str) -> dict[int, float]:
  """{step: training reward} of a run, as the report's reward curves read it."""
  steps, values = report_curves.reward_series(report_runs.load_run(run_dir)) or ([], [])
  return dict(zip(steps, values, strict=True))


def signal_section(runs_dir: str, names: list[str]) -> list[str]:
  """ES against each ES-type control (the null run) on the same training batches: the members'
  mean fitness per step, ES minus control (same data order, same noise; step 1 is the same
  model, hence Δ = 0), as markdown lines; [] without ES and a control."""
  if "es" not in names or len(names) < 2:
    return []
  es = step_rewards(os.path.join(runs_dir, "es"))
  head = ["ES − control", "steps", "ES mean", "control mean", "Δ all steps", "Δ last half"]
  head.append("ES >/=/< (last half)")
  lines = [
    "## Training signal: ES against the null control on the same batches",
    "",
    *eval_results.markdown_header(head),
  ]
  for name in [n for n in names if n != "es"]:
    other = step_rewards(os.path.join(runs_dir, name))
    steps = sorted(set(es) & set(other))
    if not steps:
      continue
    d = np.array([es[t] - other[t] for t in steps])
    late = d[len(d) // 2 :]
    cells = [
      f"ES − {demo.LABELS[name]}",
      f"{steps[0]}..{steps[-1]}",
      f"{np.mean([es[t] for t in steps]):.4f}",
      f"{np.mean([other[t] for t in steps]):.4f}",
      *[f"{x.mean():+.4f} ± {report_runs.standard_error(x):.4f}" for x in (d, late)],
      f"{int((late > 0).sum())}/{int((late == 0).sum())}/{int((late < 0).sum())}",
    ]
    lines.append(eval_results.markdown_row(cells))
  lines += [
    "",
    "Per step: the members' mean greedy fitness on that step's training batch (metrics.jsonl "
    "train/reward). ± is the standard error over steps treating them as independent; the steps "
    "of one run are correlated (each model follows from the last), so it understates the "
    "uncertainty. The held-out evaluation above is the test; this says whether ES's own "
    "training reward rose above the drift-matched control's.",
    "",
  ]
  return lines
