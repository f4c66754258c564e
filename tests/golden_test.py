"""The golden record: the `smoke` ES and GRPO runs' trajectories (tests/golden/smoke_runs.json).

A change that moves training trajectories (rewards per step, where the weights end) fails this
test, so it is made deliberately: regenerate the record in the same change with

    ES_JAX_UPDATE_GOLDEN=1 python -m pytest -q -p no:xdist tests/golden_test.py

and re-measure the published figures it affects (README's demo table, docs/results/). The runs
are experiments/configs/demo.py:smoke (the tiny random model and the synthetic char_parity
reward) with method es and grpo, without evaluation or export. Weights are compared through
each leaf's distance from the base model (float64 L2 norm): robust to summation order at the
tolerance below, moved by any change to a step.
"""

import json
import os

import numpy as np
import pytest
from run_configs import assert_trained, checkpoint_params, named_leaves, smoke_config

from es_jax import models
from experiments.configs import demo as demo_config
from experiments.infra.logger import read_metrics
from experiments.runners import es_runner, grpo_runner, model_io

RECORD = os.path.join(os.path.dirname(__file__), "golden", "smoke_runs.json")
UPDATE = os.environ.get("ES_JAX_UPDATE_GOLDEN") == "1"
RTOL, ATOL = 1e-4, 1e-7  # float32 steps: order-robust, far below any one step's change
QUIET = dict(eval__every=0, eval__final=False, export_hf=False)
RUNNERS = {"es": es_runner.run, "grpo": grpo_runner.run}
METRICS = ("train/reward", "fitness/std", "reward/std")


def _trajectory(method: str, workdir: str) -> dict:
  """A smoke run's per-step metrics (METRICS) and each leaf's distance from the base model."""
  config = smoke_config(demo_config, method=method, **QUIET)
  assert RUNNERS[method](config, workdir)["stopped"] is False
  rows = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if r["step"] > 0]
  steps = {
    str(r["step"]): {k: float(r[k]) for k in METRICS if isinstance(r.get(k), float)} for r in rows
  }
  _, params = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert_trained(workdir, params)  # rewards varied and weights moved: the record can fail
  model, _ = model_io.load_model(config.model, seed=config.seed)
  base = named_leaves(models.params(model))
  distance = {
    k: float(np.linalg.norm(params[k].astype(np.float64) - base[k].astype(np.float64)))
    for k in sorted(params)
  }
  return {"steps": steps, "distance_from_base": distance}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(RUNNERS))
def test_smoke_trajectory_matches_the_golden_record(method, tmp_path):
  got = _trajectory(method, str(tmp_path))
  record = json.load(open(RECORD)) if os.path.exists(RECORD) else {}
  if UPDATE:
    record[method] = got
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    with open(RECORD, "w") as f:
      json.dump(record, f, indent=1, sort_keys=True)
      f.write("\n")
  assert method in record, f"no record for {method}: regenerate it (module docstring)"
  want = record[method]
  assert sorted(got["steps"]) == sorted(want["steps"])
  assert set(got["distance_from_base"]) == set(want["distance_from_base"])
  assert max(want["distance_from_base"].values()) > 0
  hint = "the training trajectory changed: if deliberate, regenerate (module docstring)"
  for step, metrics in want["steps"].items():
    assert set(got["steps"][step]) == set(metrics), (step, hint)
    for k, v in metrics.items():
      assert got["steps"][step][k] == pytest.approx(v, rel=RTOL, abs=ATOL), (step, k, hint)
  for k, v in want["distance_from_base"].items():
    assert got["distance_from_base"][k] == pytest.approx(v, rel=RTOL, abs=ATOL), (k, hint)
