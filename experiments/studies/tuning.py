"""The tuning stages a study shares (experiments/studies/fair_study.py,
experiments/studies/fair_study_v2.py): the σ
calibration stage, the equal-budget pilots of ES's α and GRPO's learning rate, and their tables
for the report's top. The stages' directories record their config (experiments.studies.stages).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from experiments.evaluation import results as eval_results
from experiments.infra.logger import read_metrics, write_run_files
from experiments.runners import es_runner, grpo_runner
from experiments.schema import check as config_check
from experiments.studies import calibration
from experiments.studies import stages as study_stages

log = logging.getLogger(__name__)

_RUNNERS = {"es": es_runner.run, "grpo": grpo_runner.run}


def edge_extension(values: Sequence[float], winner: float) -> float | None:
  """The grid value to add so that `winner` becomes interior: min / 3 when it is the grid's
  smallest, max · 3 when its largest, None when it is already interior."""
  grid = sorted(values)
  if winner == grid[0]:
    return grid[0] / 3
  if winner == grid[-1]:
    return grid[-1] * 3
  return None


def sub_config(config: ml_collections.ConfigDict, **updates: Any) -> ml_collections.ConfigDict:
  """A locked copy of `config` with dotted-field `updates` ("es.sigma": 0.01, ...)."""
  sub = ml_collections.ConfigDict(config.to_dict())
  for field, value in updates.items():
    group, _, name = field.rpartition(".")
    (sub[group] if group else sub)[name] = value
  sub.lock()
  return sub


def calibrated_sigma(config, workdir: str, records: dict, redo: list[str]) -> float | None:
  """σ from the calibration stage (run here unless finished), or config.es.sigma; None when a
  SIGTERM stopped the calibration (a rerun measures the σ it had not finished). `records` and
  `redo`: experiments.studies.stages."""
  if not config.fair.calibrate:
    return float(config.es.sigma)
  out = study_stages.start(workdir, "calibration", records["calibration"], redo)
  table = os.path.join(out, "calibration", "table.json")
  if not os.path.exists(table):
    sub = sub_config(config, method="calibrate")
    write_run_files(out, sub)
    if calibration.run(sub, out).get("stopped"):
      return None
  with open(table) as f:
    sigma = json.load(f)["recommended_sigma"]
  config_check.check(
    sigma is not None,
    "fair.calibrate",
    True,
    f"no σ of diversity.sigmas met the calibration rule ({table}); widen the grid or set "
    "fair.calibrate=False with es.sigma",
  )
  return float(sigma)


def pilot_score(run_dir: str) -> float:
  """Mean training reward over the last half of a pilot's steps."""
  rows = [r for r in read_metrics(run_dir) if r.get("step", 0) > 0 and "train/reward" in r]
  config_check.check(bool(rows), "fair.pilot_steps", run_dir, "the pilot logged no reward")
  rewards = [r["train/reward"] for r in sorted(rows, key=lambda r: r["step"])]
  return float(np.mean(rewards[len(rewards) // 2 :]))


def _pilot(config, out: str, candidate: tuple, sigma: float, steps: int) -> dict | None:
  """One pilot run (unless finished) and its row; None when a SIGTERM stopped it."""
  method, field, value, name = candidate
  run_dir = os.path.join(out, name)
  if not os.path.exists(os.path.join(run_dir, "DONE")):
    log.info("fair study: pilot %s (%s = %g, %d steps)", name, field, value, steps)
    common = {"eval.final": False, "eval.every": 0, "export_hf": False, "checkpoint.keep": 1}
    updates = {field: value, f"{method}.num_steps": steps, "es.sigma": sigma, **common}
    if _RUNNERS[method](sub_config(config, method=method, **updates), run_dir).get("stopped"):
      return None
  return {
    "method": method,
    "field": field,
    "value": value,
    "run": name,
    "score": pilot_score(run_dir),
  }


def _candidate(method: str, value: float, sigma: float) -> tuple:
  """(method, field, value, run name) of a pilot: ES by α/σ ratio, GRPO by learning rate."""
  if method == "es":
    return ("es", "es.learning_rate", value * sigma, f"es_alpha{value:g}sigma")
  return ("grpo", "grpo.learning_rate", value, f"grpo_lr{value:g}")


def run_pilots(config, workdir: str, sigma: float, records: dict, redo: list[str]) -> dict:
  """The pilots of the module docstring; {"alpha", "grpo_lr", "rows"} (cached in choice.json).
  With fair.design=2 a grid whose winner is at an edge gains a value beyond it (study_v2.
  edge_extension), at most fair.extensions times per method."""
  out = study_stages.start(workdir, "pilots", records["pilots"], redo)
  choice_path = os.path.join(out, "choice.json")
  if os.path.exists(choice_path):
    with open(choice_path) as f:
      return json.load(f)
  f = config.fair
  steps = int(f.pilot_steps)
  grids = {"es": [float(r) for r in f.alpha_ratios], "grpo": [float(lr) for lr in f.grpo_lrs]}
  left = {m: int(f.extensions) if int(f.design) == 2 else 0 for m in grids}
  rows, best = [], {}
  for method, grid in grids.items():
    while True:
      for value in grid[len([r for r in rows if r["method"] == method]) :]:
        row = _pilot(config, out, _candidate(method, value, sigma), sigma, steps)
        if row is None:
          return {"stopped": True}
        rows.append({**row, "grid_value": value})
      mine = [r for r in rows if r["method"] == method]
      winner = max(mine, key=lambda r: r["score"])  # max keeps the first of ties
      extra = edge_extension(grid, winner["grid_value"]) if left[method] else None
      if extra is None:
        best[method] = winner["value"]
        break
      grid, left[method] = [*grid, extra], left[method] - 1
  choice = {"alpha": best["es"], "grpo_lr": best["grpo"], "sigma": sigma, "rows": rows}
  eval_results.write_json(choice_path, choice)
  return choice


def intro_lines(workdir: str, choice: dict[str, Any]) -> list[str]:
  """The calibration table and the pilots' choice, as markdown lines for the report's top."""
  lines = []
  cal = os.path.join(workdir, "calibration", "calibration", "table.md")
  if os.path.exists(cal):
    with open(cal) as f:
      body = f.read().split("\n", 2)[2]  # without its "# σ calibration" heading
    lines += ["## σ calibration (no learning)", "", body.strip(), ""]
  head = ["pilot", "method", "value", "mean training reward, last half"]
  lines += [
    "## Tuning: the pilots (equal budget for ES and GRPO)",
    "",
    *eval_results.markdown_header(head),
  ]
  for r in choice["rows"]:
    lines.append(
      eval_results.markdown_row(
        [r["run"], r["method"], f"{r['field']} = {r['value']:.3g}", f"{r['score']:.4f}"]
      )
    )
  lines += [
    "",
    f"Chosen: σ = {choice['sigma']:g}, ES α = {choice['alpha']:.3g}, GRPO lr = "
    f"{choice['grpo_lr']:.3g} (highest mean training reward; ties: the first listed).",
    "",
  ]
  return lines
