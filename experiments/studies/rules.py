"""Study v2's pre-registered decision rules (docs/results/fair_study_v2.md), evaluated on the
evaluation results: each rule is a function of per-problem values, so the report says which fired.

Per-problem values (experiments.reports.runs.Run.per_problem[task]) hold "index" and one array per
metric ("greedy", "pass@k", ...); two runs are compared on the same problems, paired: the mean of
the per-problem differences and its standard error std(d, ddof=1) / sqrt(P) ("SE" below).

  moves        ES moves sampled behaviour: ES − base Pass@1 > 2 SE, and ES − base Pass@16 is not
               lower (> −2 SE; the largest k up to 16 when 16 was not evaluated)
  mechanism    ES supports the mechanism: `moves`, and the arm's JS_succ 95% interval is above 0,
               and ES − base grows with k (Pass@k_max difference > Pass@1 difference)
  beats_grpo   ES beats GRPO at large k: ES − GRPO Pass@k > 2 SE at some evaluated k >= 16
  narrows      GRPO narrows: GRPO − base Pass@k_max < 0 (the mean difference, at the largest k)
  se_target    the design's precision was reached: the SE of ES − GRPO at Pass@16 is <= 0.03
  extend       the extension rule (an arm and its null rerun for fair.extend_steps steps): the
               first half of `moves`, ES − base Pass@1 > 2 SE
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

PerProblem = Mapping[str, np.ndarray]


def paired(a: PerProblem, b: PerProblem, metric: str) -> tuple[float, float]:
  """Mean of a − b over the same problems and its standard error.

  Raises:
    ValueError: the two were evaluated on other problems, or on fewer than two.
  """
  if not np.array_equal(np.asarray(a["index"]), np.asarray(b["index"])):
    raise ValueError(f"{metric}: the two runs were evaluated on other problems.")
  d = np.asarray(a[metric], np.float64) - np.asarray(b[metric], np.float64)
  if d.size < 2:
    raise ValueError(f"{metric}: a paired standard error needs two problems or more.")
  return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))


def ks(values: PerProblem) -> list[int]:
  """The k of the Pass@k metrics in `values`, sorted."""
  return sorted(int(m.split("@")[1]) for m in values if m.startswith("pass@"))


def _k_up_to(values: PerProblem, k: int) -> int:
  return max(x for x in ks(values) if x <= k)


def extend(arm: PerProblem, base: PerProblem) -> tuple[bool, str]:
  mean, se = paired(arm, base, "pass@1")
  return mean > 2 * se, f"Δ Pass@1 {mean:+.4f} vs 2 SE {2 * se:.4f}"


def moves(arm: PerProblem, base: PerProblem) -> tuple[bool, str]:
  first, why = extend(arm, base)
  k = _k_up_to(arm, 16)
  mean, se = paired(arm, base, f"pass@{k}")
  return first and mean > -2 * se, f"{why}; Δ Pass@{k} {mean:+.4f} vs −2 SE {-2 * se:.4f}"


def mechanism(arm: PerProblem, base: PerProblem, js_low: float | None) -> tuple[bool, str]:
  moved, why = moves(arm, base)
  k = ks(arm)[-1]
  grows = paired(arm, base, f"pass@{k}")[0] > paired(arm, base, "pass@1")[0]
  js = "JS_succ not measured" if js_low is None else f"JS_succ CI low {js_low:.4f}"
  fired = moved and js_low is not None and js_low > 0 and grows
  return fired, f"{why}; {js}; Δ grows with k to k={k}: {grows}"


def beats_grpo(arm: PerProblem, grpo: PerProblem) -> tuple[bool, str]:
  large = [k for k in ks(arm) if k >= 16]
  if not large:
    return False, "no k >= 16 evaluated"
  cells = [(k, *paired(arm, grpo, f"pass@{k}")) for k in large]
  fired = [k for k, mean, se in cells if mean > 2 * se]
  detail = ", ".join(f"k={k}: {m:+.4f} (2 SE {2 * s:.4f})" for k, m, s in cells)
  return bool(fired), f"ES − GRPO {detail}"


def se_target(arm: PerProblem, grpo: PerProblem, target: float = 0.03) -> tuple[bool, str]:
  k = _k_up_to(arm, 16)
  se = paired(arm, grpo, f"pass@{k}")[1]
  return se <= target, f"SE of ES − GRPO Pass@{k} {se:.4f} (target {target})"


def narrows(grpo: PerProblem, base: PerProblem) -> tuple[bool, str]:
  k = ks(grpo)[-1]
  mean, se = paired(grpo, base, f"pass@{k}")
  return mean < 0, f"GRPO − base Pass@{k} {mean:+.4f} ± {se:.4f}"


def evaluate(
  per: Mapping[str, PerProblem], es_arms: list[str], js_low: Mapping[str, float | None]
) -> list[dict[str, Any]]:
  """Every rule on the runs `per` (label -> per-problem values, with "base" and "GRPO"): the ES
  rules for each label of `es_arms` present; rows {"rule", "arm", "fired", "evidence"}."""
  rows = []
  for arm in [a for a in es_arms if a in per]:
    for rule, (fired, why) in (
      ("moves", moves(per[arm], per["base"])),
      ("mechanism", mechanism(per[arm], per["base"], js_low.get(arm))),
      ("beats_grpo", beats_grpo(per[arm], per["GRPO"])),
      ("se_target", se_target(per[arm], per["GRPO"])),
    ):
      rows.append({"rule": rule, "arm": arm, "fired": fired, "evidence": why})
  fired, why = narrows(per["GRPO"], per["base"])
  rows.append({"rule": "narrows", "arm": "GRPO", "fired": fired, "evidence": why})
  return rows


NAMES = {
  "moves": "ES moves sampled behaviour",
  "mechanism": "ES supports the mechanism",
  "beats_grpo": "ES beats GRPO at large k",
  "narrows": "GRPO narrows coverage",
  "se_target": "design check: SE of ES − GRPO at Pass@16 ≤ 0.03",
}


def markdown(rows: list[dict[str, Any]], preregistration: str) -> list[str]:
  """The decision-rule section of the report (markdown lines)."""
  commit = preregistration or "not recorded (config fair.preregistration is empty)"
  lines = [
    "## Pre-registered decision rules",
    "",
    f"Pre-registration: docs/results/fair_study_v2.md at commit {commit}; the rules as "
    "experiments/studies/rules.py evaluates them.",
    "",
    "| rule | arm | fired | evidence |",
    "|---|---|---|---|",
  ]
  for r in rows:
    fired = "**yes**" if r["fired"] else "no"
    lines.append(f"| {NAMES[r['rule']]} | {r['arm']} | {fired} | {r['evidence']} |")
  return [*lines, ""]
