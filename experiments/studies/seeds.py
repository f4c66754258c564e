"""Study v2's runs with two seeds, combined (docs/results/fair_study_v2.md): for each metric the
difference from the base model per seed with its paired per-problem standard error, their mean,
and the spread over seeds (|seed a − seed b|), so that the two sources of noise sit side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from experiments.studies import rules as study_rules

PerProblem = Mapping[str, np.ndarray]


def combine(seeds: Sequence[PerProblem], base: PerProblem, metric: str) -> dict[str, float]:
  """{"deltas", "ses", "mean", "spread"} of run − base on `metric` over the runs `seeds` (one
  per seed, the same problems): spread is max − min of the per-seed differences."""
  cells = [study_rules.paired(run, base, metric) for run in seeds]
  deltas = [m for m, _ in cells]
  return {
    "deltas": deltas,
    "ses": [s for _, s in cells],
    "mean": float(np.mean(deltas)),
    "spread": float(max(deltas) - min(deltas)),
  }


def markdown(groups: Mapping[str, Sequence[PerProblem]], base: PerProblem) -> list[str]:
  """The seeds section: one row per (arm, metric) for each arm with two seeds or more."""
  groups = {arm: runs for arm, runs in groups.items() if len(runs) > 1}
  if not groups:
    return []
  lines = [
    "## Seeds: difference from the base model per seed",
    "",
    "| arm | metric | Δ per seed (± paired SE) | mean over seeds | spread over seeds |",
    "|---|---|---|---|---|",
  ]
  for arm, runs in groups.items():
    metrics = ["greedy", *[f"pass@{k}" for k in study_rules.ks(runs[0])]]
    for metric in metrics:
      c = combine(runs, base, metric)
      per_seed = ", ".join(
        f"{d:+.4f} ± {s:.4f}" for d, s in zip(c["deltas"], c["ses"], strict=True)
      )
      lines.append(f"| {arm} | {metric} | {per_seed} | {c['mean']:+.4f} | {c['spread']:.4f} |")
  lines += [
    "",
    "The paired SE is over problems for one seed; the spread is the disagreement between seeds "
    "(training noise), which that SE does not contain.",
    "",
  ]
  return lines
