"""experiments.studies.population_sweep: the debiased EMA against hand-computed values, and a sweep
of two population sizes on the demo's smoke config."""

import pytest
from ml_collections import ConfigDict

from experiments.configs import demo as demo_config
from experiments.infra.logger import read_metrics
from experiments.reports import curves as report_curves
from experiments.reports import runs as report_runs
from experiments.studies import population_sweep


def test_debiased_ema_hand_computed():
  # s_1 = 0.01, ŝ_1 = 0.01 / 0.01 = 1; s_2 = 0.0099, ŝ_2 = 0.0099 / (1 - 0.9801) = 99/199;
  # s_3 = 0.99 · 0.0099 + 0.01 = 0.019801, ŝ_3 = 0.019801 / (1 - 0.970299) = 19801/29701.
  got = population_sweep.debiased_ema([1.0, 0.0, 1.0], 0.99)
  assert got.tolist() == pytest.approx([1.0, 99 / 199, 19801 / 29701], rel=1e-12)
  # A constant reward stays constant from step 1 (uncorrected, s_1 = 0.008).
  assert population_sweep.debiased_ema([0.8] * 300, 0.99) == pytest.approx([0.8] * 300)
  # decay 0.5 on (0, 4): s = 0, 2; ŝ_2 = 2 / 0.75.
  assert population_sweep.debiased_ema([0.0, 4.0], 0.5).tolist() == pytest.approx([0.0, 8 / 3])
  assert population_sweep.debiased_ema([0.3, 0.7], 0.0).tolist() == [0.3, 0.7]
  with pytest.raises(ValueError, match="decay"):
    population_sweep.debiased_ema([1.0], 1.0)


@pytest.mark.slow
def test_population_sweep_runs_each_size(tmp_path):
  c = ConfigDict(demo_config.get_config("smoke").to_dict())
  c.method, c.progress, c.export_hf = "population_sweep", False, False
  c.eval.every = 0
  c.es.num_steps = 2
  c.population_sweep.sizes = "4,2"
  c.lock()
  result = population_sweep.run(c, str(tmp_path))
  assert sorted(result["smoothed_final_reward"]) == [2, 4]
  assert result["ema_decay"] == 0.99 and result["final_step"] == {2: 2, 4: 2}
  for n in (2, 4):  # the reported value is the debiased EMA of the logged rewards
    run = report_runs.Run(
      "r", str(tmp_path / f"N={n}"), rows=read_metrics(tmp_path / f"N={n}" / "metrics.jsonl")
    )
    steps, logged = report_curves.reward_series(run)
    want = population_sweep.debiased_ema(logged, 0.99)[-1]
    assert result["smoothed_final_reward"][n] == pytest.approx(want, abs=1e-12)
  # The smallest N whose smoothed reward is within the tolerance of the largest N's, and a
  # tolerance that takes in every size picks the smallest one.
  final, tolerance = result["smoothed_final_reward"], c.population_sweep.tolerance
  assert result["smallest_sufficient_N"] == (2 if final[2] >= final[4] - tolerance else 4)
  wide = ConfigDict(c.to_dict())
  wide.population_sweep.tolerance = 1.0  # rewards are in [0, 1]
  again = population_sweep.run(wide, str(tmp_path))  # reads the finished runs, trains nothing
  assert again["smallest_sufficient_N"] == 2 and again["smoothed_final_reward"] == final
  narrow = ConfigDict(c.to_dict())
  narrow.population_sweep.tolerance = 0.0
  best = max(final, key=lambda n: (final[n], -n))  # the best reward, the smallest N on a tie
  assert population_sweep.run(narrow, str(tmp_path))["smallest_sufficient_N"] == best
  assert (tmp_path / "N=2" / "DONE").exists() and (tmp_path / "sweep.png").stat().st_size > 1000
  with pytest.raises(ValueError, match="population_sweep.sizes"):
    c2 = ConfigDict(c.to_dict())
    c2.population_sweep.sizes = "eight"
    population_sweep.run(c2, str(tmp_path / "bad"))  # refused by config_check.validate
