"""Study v2 (experiments/studies/fair_study_v2.py): the interior-choice rules and the study end to
end on the `:smoke` config (every stage and arm, the extension of an arm that moves, the report)."""

import json
import os

import numpy as np
import pytest
from run_configs import smoke_config

from experiments.configs import fair_study_v2 as v2_config
from experiments.studies import calibration, fair_study
from experiments.studies import rules as study_rules
from experiments.studies import tuning as study_tuning


def test_an_edge_winner_extends_the_grid_beyond_that_edge():
  assert study_tuning.edge_extension([1e-5, 3e-6, 3e-5], 3e-5) == 9e-5
  assert np.isclose(study_tuning.edge_extension([0.25, 0.5, 1.0], 0.25), 0.25 / 3)
  assert study_tuning.edge_extension([0.25, 0.5, 1.0], 0.5) is None


def _cal(sigma, changed, minus_base, js_low=0.0):
  return {
    "sigma": sigma,
    "changed": changed,
    "fitness_minus_base": minus_base,
    "js_succ_ci": [js_low, js_low + 0.01],
  }


def test_the_calibration_grid_grows_until_sigma_is_interior_with_a_measurable_wider_one():
  # Every σ passes (study v1's case): the rule would return the floor; extend below it.
  rows = [_cal(1e-3, 0.2, 0.0), _cal(3e-3, 0.5, 0.0), _cal(1e-2, 0.8, -0.01, 0.02)]
  assert np.isclose(calibration.extension(rows, 0.1, 0.05), 1e-3 / 3)
  rows.append(_cal(1e-3 / 3, 0.05, 0.0))  # too few changed answers: 1e-3 is now interior
  assert calibration.extension(rows, 0.1, 0.05) is None
  assert calibration.wide_sigma(rows, 1e-3) == 1e-2
  # No wider σ with JS_succ above zero: extend above the top.
  flat = [dict(r, js_succ_ci=[0.0, 0.01]) for r in rows]
  assert np.isclose(calibration.extension(flat, 0.1, 0.05), 3e-2)
  # Nothing changes answers: extend up; everything breaks the model: extend down.
  assert np.isclose(
    calibration.extension([_cal(1e-3, 0.0, 0.0), _cal(3e-3, 0.0, 0.0)], 0.1, 0.05), 9e-3
  )
  assert np.isclose(
    calibration.extension([_cal(1e-3, 0.5, -1), _cal(3e-3, 0.9, -1)], 0.1, 0.05), 1e-3 / 3
  )


@pytest.mark.slow
def test_study_v2_smoke_end_to_end(tmp_path, monkeypatch):
  config = smoke_config(v2_config, fair__preregistration="abc1234")
  fired = []
  real = study_rules.extend

  def first_arm_moves(arm, base):  # the extension of a moving arm, whatever the tiny model does
    fired.append(len(fired) == 0)
    return fired[-1], real(arm, base)[1]

  monkeypatch.setattr(study_rules, "extend", first_arm_moves)
  result = fair_study.run(config, str(tmp_path))
  assert result["stopped"] is False
  cal = json.load(open(tmp_path / "calibration" / "calibration" / "table.json"))
  grid = sorted(cal["grid"])
  assert len(grid) > len(config.diversity.sigmas)  # the smoke grid's floor passes: extended
  choice = json.load(open(tmp_path / "pilots" / "choice.json"))
  assert choice["sigma"] == cal["recommended_sigma"]
  for method, field in (("es", "alpha"), ("grpo", "grpo_lr")):
    mine = [r for r in choice["rows"] if r["method"] == method]
    values = sorted(r["grid_value"] for r in mine)
    winner = next(r for r in mine if r["value"] == choice[field])
    # One value per smoke grid: its winner is at both edges, so it gained the value a third of
    # it (the only extension the smoke config allows); the winner is either of the two.
    assert len(values) == 2 and winner["grid_value"] in values
    assert np.isclose(values[0] * 3, values[1])
  runs = sorted(d for d in os.listdir(tmp_path / "runs") if not d.endswith(".json"))
  best = next(d.rsplit("_seed", 1)[0] for d in runs if d.endswith("_seed1") and d[:4] != "grpo")
  expected = ["base", "es", "es_null", "es_sampled", "es_wide", "grpo", f"{best}_seed1"]
  expected += ["grpo_seed1", "es_long", "es_null_long"]
  assert runs == sorted(expected)
  saved = {d: json.load(open(tmp_path / "runs" / d / "config.json")) for d in runs if d != "base"}
  alphas = {c["es"]["learning_rate"] for d, c in saved.items() if c["method"] == "es"}
  assert alphas == {choice["alpha"]}  # α fixed across ES arms: one null serves them all
  assert saved["es_null"]["es"]["shaping"] == "shuffled"
  assert saved["es_wide"]["es"]["sigma"] > saved["es"]["es"]["sigma"] == choice["sigma"]
  sampled = saved["es_sampled"]["es"]
  assert sampled["temperature"] == 0.6 and sampled["share_sample_key"] is True
  assert saved["grpo_seed1"]["seed"] == 1 and saved["grpo"]["seed"] == 0
  assert saved["es_long"]["es"]["num_steps"] == config.fair.extend_steps
  assert saved["es_null_long"]["es"]["shaping"] == "shuffled"
  report = open(tmp_path / "report.md").read()
  for heading in (
    "## σ calibration",
    "## Tuning: the pilots",
    "## Pre-registered decision rules",
    "## Seeds: difference from the base model per seed",
    "## Time per unit of work",
    "## Training signal",
  ):
    assert heading in report
  assert "commit abc1234" in report and "| GRPO narrows coverage | GRPO |" in report
  assert "| ES − GRPO |" in report  # paired differences of each ES arm against GRPO
