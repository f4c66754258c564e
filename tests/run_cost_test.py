"""experiments.tpu.run_cost: the run-time arithmetic from given per-step costs (no libtpu
needed)."""

import numpy as np
import pytest

from es_jax.devices import memory_plan
from experiments.tpu import programs as tpu_programs
from experiments.tpu import run_cost

CHIP = memory_plan.Chip("test chip", 16 * 2**30, peak_flops=100e12, hbm_bandwidth=1e12)


def _result(name, flops, nbytes, trips):
  return {"program": name, "step": {"flops": flops, "bytes": nbytes, "trips": trips}}


def test_roofline_takes_the_slower_of_compute_and_bandwidth():
  assert run_cost.roofline_seconds(1e12, 1e9, CHIP) == pytest.approx(0.01)  # compute-bound
  assert run_cost.roofline_seconds(1e9, 5e9, CHIP) == pytest.approx(0.005)  # bandwidth-bound


def test_length_mix_parse_and_expected_longest_row():
  mix = run_cost.parse_length_mix("0.25:0.7, 1:0.3")
  assert mix == {0.25: 0.7, 1.0: 0.3}
  assert run_cost.mean_fraction(mix) == pytest.approx(0.475)
  assert run_cost.expected_max_fraction(mix, 1) == pytest.approx(0.475)  # one row: the mean
  # Two rows: the longer is the budget unless both are short (0.49).
  assert run_cost.expected_max_fraction(mix, 2) == pytest.approx(0.25 + 0.75 * (1 - 0.49))
  # Against a simulation of the longest of 8 rows.
  rng = np.random.default_rng(0)
  draws = rng.choice([0.25, 1.0], p=[0.7, 0.3], size=(200_000, 8)).max(axis=1)
  assert run_cost.expected_max_fraction(mix, 8) == pytest.approx(draws.mean(), abs=3e-3)
  assert run_cost.expected_max_fraction(run_cost.BUDGET, 512) == 1.0
  for bad in ("0.5:0.5", "1.5:1", "x", "0.5"):
    with pytest.raises(ValueError, match="--length_mix"):
      run_cost.parse_length_mix(bad)


def test_eval_calls_follow_the_sampler_layout():
  # 10 problems in blocks of 4 (4, 4, 2): greedy + ceil(p·n/4) sampled calls each.
  assert run_cost.eval_calls(10, 3, 4) == (1 + 3) + (1 + 3) + (1 + 2)
  assert run_cost.eval_calls(10, 3, 4, greedy=False) == 8


def _config(method="es", **overrides):
  config = tpu_programs.load_config(
    "experiments/configs/gsm8k_easy.py:smoke", [f"--config.method={method}"]
  )
  config.unlock()
  for dotted, value in overrides.items():
    section, field = dotted.split("__")
    config[section][field] = value
  return config


def _results(decode=1e9):
  return [
    _result("es_population", 1e12, decode, 100),  # 0.01 s per trip
    _result("es_update", 1e9, 2e10, 4),  # 0.02 s per trip
    _result("grpo_rollout", 1e9, decode, 50),  # 0.001 s per trip
    _result("grpo_update", 3e12, 1e9, 2),  # 0.03 s per trip
    _result("eval", 1e9, 2e9, 10),  # 0.002 s per trip
  ]


def test_es_run_plan_adds_steps_evaluations_and_chip_hours():
  config = _config(
    es__num_steps=10,
    eval__final=True,
    eval__every=5,
    eval__limit=8,
    eval__num_samples=2,
    eval__batch_size=4,
    eval__periodic_limit=4,
    eval__periodic_num_samples=1,
  )
  plan = run_cost.plan_run(config, _results(), CHIP, chips=8, pop=8)
  step = 0.01 * 100 + 0.02 * 4
  final = run_cost.eval_calls(8, 2, 4) * 0.002 * 10
  periodic = 2 * run_cost.eval_calls(4, 1, 4) * 0.002 * 10  # after steps 5 and 10
  assert plan["step_seconds"] == {"es": pytest.approx(step)}
  assert plan["final_eval_seconds"] == pytest.approx(final)
  assert plan["run_seconds"] == pytest.approx(10 * step + final + periodic)
  assert plan["chip_hours"] == pytest.approx(plan["run_hours"] * 8)
  # A length mix shortens the decode programs only, by the expected longest row of a call.
  mix = {0.5: 0.999, 1.0: 0.001}
  short = run_cost.plan_run(config, _results(), CHIP, chips=8, pop=8, mix=mix)
  rows = 8 * int(config.es.members_per_chunk) * int(config.data.prompts_per_step)
  fraction = run_cost.expected_max_fraction(mix, rows)
  assert 0.5 < fraction < 1.0
  assert short["step_seconds"]["es"] == pytest.approx(0.01 * 100 * fraction + 0.02 * 4)


def test_sequential_plan_splits_the_budget_and_refuses_other_methods():
  config = _config("sequential", sequential__total_steps=10, eval__final=False, eval__every=0)
  config.sequential.first_fraction = 0.3
  config.sequential.order = "grpo_es"
  plan = run_cost.plan_run(config, _results(), CHIP, chips=4, pop=4)
  assert plan["steps"] == {"grpo": 3, "es": 7}
  grpo_step, es_step = 0.001 * 50 + 0.03 * 2, 0.01 * 100 + 0.02 * 4
  assert plan["run_seconds"] == pytest.approx(3 * grpo_step + 7 * es_step)
  with pytest.raises(ValueError, match="method='evaluate'"):
    run_cost.plan_run(_config("evaluate"), _results(), CHIP, chips=4, pop=4)
  missing = [r for r in _results() if r["program"] != "es_update"]
  missing.append({"program": "es_update", "step": {"trips": 4, "error": "boom"}})
  with pytest.raises(ValueError, match="es_update: no per-step cost"):
    run_cost.plan_run(config, missing, CHIP, chips=4, pop=4)


def test_slice_names_count_tensorcores_on_v4_and_v5p():
  assert run_cost.slice_name("v6e", 8) == "v6e-8"
  assert run_cost.slice_name("v5p", 8) == "v5p-16"
  assert run_cost.slice_name("v4", 4) == "v4-8"
  text = run_cost.format_plan(
    {
      "steps": {"es": 2},
      "step_seconds": {"es": 1.5},
      "final_eval_seconds": 60.0,
      "periodic_eval_seconds": 0.0,
      "run_hours": 2.0,
      "chip_hours": 16.0,
      "mean_length_fraction": 1.0,
    },
    "v6e-8",
  )
  assert "this run: ~2.0 hours on v6e-8, 16 chip-hours" in text
