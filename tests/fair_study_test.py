"""The fair study's pieces: the σ calibration rule, the null-walk drift prediction against a
simulated z-scored ES walk, and the study end to end on the `:smoke` config (stopped by SIGTERM
in its calibration, then run to the end)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from run_configs import checkpoint_params, smoke_config

from es_jax import metrics
from es_jax.es import gradient as es
from es_jax.es import noise
from experiments.configs import fair_study as fair_config
from experiments.infra.logger import read_metrics
from experiments.studies import calibration, fair_study
from experiments.studies import training_signal as study_signal


def _row(sigma, changed, minus_base):
  return {"sigma": sigma, "changed": changed, "fitness_minus_base": minus_base}


def test_recommend_takes_the_smallest_sigma_meeting_both_rules():
  rows = [
    _row(3e-2, 1.0, -0.2),
    _row(1e-3, 0.02, 0.0),
    _row(1e-2, 0.6, -0.04),
    _row(3e-3, 0.3, -0.06),
  ]
  sigma, note = calibration.recommend(rows, min_changed=0.1, tolerance=0.05)
  assert sigma == 1e-2 and "σ = 0.01" in note  # 1e-3 changes too little, 3e-3 loses fitness
  sigma, note = calibration.recommend(rows, min_changed=0.1, tolerance=0.1)
  assert sigma == 3e-3
  sigma, note = calibration.recommend(rows[:2], min_changed=0.5, tolerance=0.05)
  assert sigma is None and "changed < min" in note and "fitness below tolerance" in note


@pytest.mark.slow
def test_null_drift_predicts_a_z_scored_random_walk(key):
  n, steps, alpha = 8, 12, 1e-2
  params = {"w": jax.random.normal(key, (300, 200)), "b": jnp.ones((500,))}
  spec = noise.NoiseSpec(n)
  opt = optax.chain(es.es_gradient(spec, shaping="zscore"), optax.sgd(alpha))
  state, p = opt.init(params), params
  for t in range(steps):
    k = jax.random.fold_in(key, t)
    fitness = jax.random.uniform(jax.random.fold_in(k, 99), (n,))  # no signal
    updates, state = opt.update(p, state, p, fitness=fitness, key=k)
    p = optax.apply_updates(p, updates)
  size = sum(x.size for x in jax.tree.leaves(params))
  norm = float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(params))))
  predicted = metrics.null_drift(alpha, size, steps, n, norm)
  measured = float(metrics.relative_drift(p, params))
  assert abs(measured / predicted - 1) < 0.03, (measured, predicted)
  assert metrics.null_drift(alpha, size, 0, n, norm) == 0.0  # constant fitness never moves


def test_training_signal_pairs_es_and_the_control_step_by_step(tmp_path):
  rewards = {"es": [0.25, 0.5, 0.75, 0.5], "es_null": [0.25, 0.25, 0.5, 0.5]}
  for name, values in rewards.items():
    rows = [{"step": 0}] + [{"step": i + 1, "train/reward": v} for i, v in enumerate(values)]
    os.makedirs(tmp_path / name)
    (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  lines = study_signal.signal_section(str(tmp_path), ["es", "es_null"])
  (row,) = [ln for ln in lines if ln.startswith("| ES − ES null")]
  cells = [c.strip() for c in row.strip("|").split("|")]
  # Δ per step: 0, 0.25, 0.25, 0; last half (steps 3, 4): 0.25, 0.
  d, late = np.array([0, 0.25, 0.25, 0]), np.array([0.25, 0.0])
  assert cells[1:4] == ["1..4", "0.5000", "0.3750"]
  assert cells[4] == f"+{d.mean():.4f} ± {d.std(ddof=1) / 2:.4f}"
  assert cells[5] == f"+{late.mean():.4f} ± {late.std(ddof=1) / np.sqrt(2):.4f}"
  assert cells[6] == "1/1/0"
  assert study_signal.signal_section(str(tmp_path), ["es"]) == []


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  """The study on the `:smoke` config, stopped by SIGTERM in its calibration after the first σ
  and run again to the end: its workdir, config, the σ measured by each run, the rows the stopped
  calibration kept, and the two runs' results."""
  tmp_path = tmp_path_factory.mktemp("fair_study")
  config = smoke_config(
    fair_config,
    fair__alpha_ratios=(0.5, 1.0),
    fair__grpo_lrs=(1e-5,),
    fair__pilot_steps=1,
  )
  measured = []
  real = calibration.measure_sigma

  def counting(*args, **kwargs):
    row = real(*args, **kwargs)
    measured.append(row["sigma"])
    return row

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(calibration, "measure_sigma", counting)
    calls = iter([False, True])  # SIGTERM arrives after the first σ
    patch.setattr(calibration.preemption, "preempted", lambda: next(calls, True))
    stopped = fair_study.run(config, str(tmp_path))
    stopped["pilots_chosen"] = (tmp_path / "pilots" / "choice.json").exists()
    first = list(measured)
    partial = tmp_path / "calibration" / "calibration" / "rows.partial.json"
    partial = json.load(open(partial))["rows"]
    patch.setattr(calibration.preemption, "preempted", lambda: False)
    result = fair_study.run(config, str(tmp_path))
  return tmp_path, config, (first, measured), partial, (stopped, result)


@pytest.mark.slow
def test_calibration_stops_on_sigterm_and_resumes_the_missing_sigmas(study):
  tmp_path, config, (first, measured), partial, (stopped, _) = study
  assert stopped == {"stopped": True, "pilots_chosen": False}  # stopped in its first stage
  assert first == [config.diversity.sigmas[0]]
  assert measured == list(config.diversity.sigmas)  # the rerun measured only the missing σ
  table = json.load(open(tmp_path / "calibration" / "calibration" / "table.json"))
  row = table["rows"][0]  # the measured part kept; survival (cheap) recomputed on every run
  assert {k: row[k] for k in partial[0]} == partial[0] and "survives_bf16" in row
  choice = json.load(open(tmp_path / "pilots" / "choice.json"))
  assert choice["sigma"] == table["recommended_sigma"]


@pytest.mark.slow
def test_fair_study_smoke_end_to_end(study):
  tmp_path, config, _, _, (_, result) = study
  assert result["stopped"] is False
  cal = json.load(open(tmp_path / "calibration" / "calibration" / "table.json"))
  assert [r["sigma"] for r in cal["rows"]] == list(config.diversity.sigmas)
  assert all(0 <= r["changed"] <= 1 and r["survives_compute"] > 0.99 for r in cal["rows"])
  # A larger σ moves the greedy answers at least as often (tiny model, same noise direction).
  assert cal["rows"][-1]["changed"] >= cal["rows"][0]["changed"]
  choice = json.load(open(tmp_path / "pilots" / "choice.json"))
  sigma = cal["recommended_sigma"]
  assert choice["sigma"] == sigma
  es_pilots = [r for r in choice["rows"] if r["method"] == "es"]
  assert [r["value"] for r in es_pilots] == [0.5 * sigma, 1.0 * sigma]
  assert choice["alpha"] == max(es_pilots, key=lambda r: r["score"])["value"]
  runs = tmp_path / "runs"
  for name, shaping in (("es", "zscore"), ("es_null", "shuffled")):
    saved = json.load(open(runs / name / "config.json"))
    assert saved["es"]["shaping"] == shaping
    assert saved["es"]["sigma"] == sigma and saved["es"]["learning_rate"] == choice["alpha"]
  assert (
    json.load(open(runs / "grpo" / "config.json"))["grpo"]["learning_rate"] == choice["grpo_lr"]
  )
  # Same seed, noise and data: the null run differs from ES only in which member gets which
  # weight, so their weights differ while both moved.
  es_rows = [r for r in read_metrics(str(runs / "es")) if r["step"] > 0]
  assert max(r["fitness/std"] for r in es_rows) > 0, "rewards never varied"
  _, es_params = checkpoint_params(str(runs / "es" / "checkpoints"))
  _, null_params = checkpoint_params(str(runs / "es_null" / "checkpoints"))
  assert any(not np.array_equal(es_params[k], null_params[k]) for k in es_params)
  drift = json.load(open(tmp_path / "drift" / "drift.json"))
  for row in drift["rows"]:
    assert row["steps_moved"] > 0 and abs(row["drift"] / row["predicted_null"] - 1) < 0.1
    assert row["sparsity"] == sorted(row["sparsity"])  # s_τ grows with τ
  report = open(tmp_path / "report.md").read()
  for heading in ("## σ calibration", "## Tuning: the pilots", "## Drift and update sparsity"):
    assert heading in report
  assert "ES null (shuffled fitness)" in report
  part = report[report.index("Differences between runs on the same problems") :]
  assert "| ES − ES null (shuffled fitness) |" in part and "| ES − GRPO |" in part
  assert "## Training signal: ES against the null control" in report
  js_row = next(ln for ln in report.splitlines() if ln.startswith("| ES | ") and "±" in ln)
  assert "[" in js_row  # the diversity study's JS_succ interval is attached to the ES row
  assert os.path.exists(tmp_path / "drift" / "sparsity_curves.png")
  # A rerun under the same config reuses every stage (each recorded its config).
  for stage in ("calibration", "pilots", "runs", "diversity"):
    assert os.path.exists(tmp_path / stage / "stage_config.json")
  kept = {
    p: os.path.getmtime(p) for p in (runs / "es" / "DONE", tmp_path / "pilots" / "choice.json")
  }
  assert fair_study.run(config, str(tmp_path))["stopped"] is False
  assert {p: os.path.getmtime(p) for p in kept} == kept


def test_survival_is_the_cosine_of_the_rounded_change_with_the_perturbation(key):
  # Weights near 1 (a bfloat16 ulp of 2**-7): a perturbation far below the ulp mostly rounds
  # to noise (a few whole-ulp jumps), one far above it survives; float32 keeps both.
  params = {"w": 1.0 + 0.1 * jax.random.uniform(key, (64, 48)), "b": jnp.ones((48,))}
  spec = noise.NoiseSpec(population_size=2)
  small = calibration.survival(params, jnp.float32, key, 1e-4, spec)
  assert abs(small["survives_compute"] - 1.0) < 1e-3
  # Expected cosine sqrt(E[δ²] / (ulp·E|δ|)) ≈ 0.13 here; the norm ratio it replaced read > 1.
  assert small["survives_bf16"] < 0.3
  large = calibration.survival(params, jnp.bfloat16, key, 1e-1, spec)
  assert large["survives_compute"] > 0.95 and large["survives_bf16"] > 0.95
  assert large["relative_sigma"] == pytest.approx(
    1e-1 / float(jnp.sqrt(jnp.mean(jnp.concatenate([jnp.ravel(params["w"]), params["b"]]) ** 2))),
    rel=1e-5,
  )
