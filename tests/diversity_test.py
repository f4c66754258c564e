"""JS_succ estimators from counts, the bootstrap interval, the union formula, coverage shaping,
and the diversity runner end to end at smoke size."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from es_jax import metrics
from es_jax.es import fitness
from es_jax.es import gradient as es_lib


def _entropy(p):
  p = np.clip(p, 1e-300, 1.0)
  q = np.clip(1.0 - p, 1e-300, 1.0)
  return -(p * np.log(p)) - q * np.log(q)


def _true_js(p):
  return _entropy(p.mean()) - _entropy(p).mean()


@pytest.mark.slow
def test_js_success_on_known_populations():
  # Half the members always right, half always wrong: JS_succ = h(1/2) = ln 2 exactly.
  p = np.array([[1.0, 0.5], [1.0, 0.5], [0.0, 0.5], [0.0, 0.5]])
  js = np.asarray(metrics.js_success_diversity(p, average=False))
  np.testing.assert_allclose(js, [np.log(2.0), 0.0], atol=1e-6)
  # Hand value for p = (0.2, 0.6): h(0.4) − (h(0.2) + h(0.6)) / 2.
  hand = _entropy(0.4) - (_entropy(0.2) + _entropy(0.6)) / 2
  got = metrics.js_success_diversity(np.array([[0.2], [0.6]]))
  np.testing.assert_allclose(got, hand, rtol=1e-5)


def test_union_formula():
  p = np.array([[0.1, 0.5], [0.3, 0.5], [0.8, 0.5]])
  u = metrics.success_union(p)
  np.testing.assert_allclose(u.population, [1 - 0.9 * 0.7 * 0.2, 1 - 0.5**3], rtol=1e-6)
  np.testing.assert_allclose(u.mean_policy, [1 - (1 - 0.4) ** 3, 1 - 0.5**3], rtol=1e-6)
  assert u.population[0] > u.mean_policy[0]  # different members: the union gains


@pytest.mark.parametrize("p", [0.5, 0.1, 0.03])
def test_identical_members_read_zero_after_null_correction(p):
  # A GRPO group / σ = 0: every member has the same p; the plug-in reads ≈ 1/(2n), corrected ≈ 0.
  rng = np.random.default_rng(0)
  counts = rng.binomial(8, p, size=(8, 4000))
  plugin = metrics.js_success_from_counts(counts, 8, correction="none").mean()
  null = metrics.js_success_from_counts(counts, 8, correction="null").mean()
  mm = metrics.js_success_from_counts(counts, 8, correction="miller_madow").mean()
  assert plugin > 0.02
  assert abs(null) < 0.006 < plugin
  assert abs(null) < abs(mm)


def test_null_correction_tracks_a_spread_population_and_bootstrap_covers_it():
  true_p = np.linspace(0.1, 0.9, 8)
  rng = np.random.default_rng(1)
  counts = rng.binomial(16, true_p[:, None], size=(8, 400))
  js = metrics.js_success_from_counts(counts, 16)
  ci = metrics.bootstrap_ci(js, num_resamples=500, seed=0)
  truth = _true_js(true_p)
  assert ci.low <= truth <= ci.high, (ci, truth)
  assert ci.high - ci.low < 0.05
  plugin = metrics.js_success_from_counts(counts, 16, correction="none").mean()
  assert abs(ci.mean - truth) < abs(plugin - truth)


def test_count_estimator_rejects_bad_input():
  with pytest.raises(ValueError, match="0 <= counts <= n"):
    metrics.js_success_from_counts(np.array([[3]]), 2)
  with pytest.raises(ValueError, match="correction"):
    metrics.js_success_from_counts(np.array([[1]]), 2, correction="jackknife")
  with pytest.raises(ValueError, match="finite"):
    metrics.bootstrap_ci([0.1, np.nan])


def test_coverage_weights_by_hand():
  # Members x prompts successes. Member 0 solves prompt 0 alone; prompt 1 is solved by 0, 1, 2.
  s = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 1], [0, 0, 0]], np.float32)
  c = np.array([1 + 1 / 3, 1 / 3, 1 / 3 + 1, 0.0]) / 3  # 1 / (1 + others' successes)
  want = (c - c.mean()) / (c.std() + fitness.ZSCORE_EPS)
  np.testing.assert_allclose(fitness.coverage(s), want, rtol=1e-5)
  # Plain mean reward ranks members 0 and 2 equal; coverage prefers neither over the other
  # only when their unique solves match: here both have one unique solve.
  np.testing.assert_allclose(fitness.coverage(s)[0], fitness.coverage(s)[2], rtol=1e-6)
  assert np.all(fitness.coverage(np.ones((4, 3))) == 0.0)
  w = fitness.shape_fitness(s, population_size=4, shaping="coverage")
  np.testing.assert_allclose(w, want, rtol=1e-5)
  with pytest.raises(ValueError, match="expected"):
    fitness.shape_fitness(s.mean(1), population_size=4, shaping="coverage")


def test_coverage_shaping_in_the_optax_chain_improves_a_toy_objective():
  # Toy: prompt p is solved with reward sigmoid(10 θ_p); every prompt improves with θ.
  from es_jax.es import noise
  from es_jax.es.members import perturb_member

  n, sigma = 8, 0.1
  spec = noise.NoiseSpec(n)
  opt = optax.chain(es_lib.es_gradient(spec, shaping="coverage"), optax.sgd(0.05))

  @jax.jit
  def step(params, state, key):
    members = jax.vmap(lambda i: perturb_member(params, key, i, sigma, spec)["w"])(jnp.arange(n))
    updates, state = opt.update(
      params, state, params, fitness=jax.nn.sigmoid(10 * members), key=key
    )
    return optax.apply_updates(params, updates), state

  params = {"w": jnp.zeros((6,), jnp.float32)}
  state = opt.init(params)
  start = float(jax.nn.sigmoid(10 * params["w"]).mean())
  for s in range(10):
    params, state = step(params, state, jax.random.fold_in(jax.random.key(0), s))
  end = float(jax.nn.sigmoid(10 * params["w"]).mean())
  assert end > start + 0.2, (start, end)


@pytest.mark.slow
def test_diversity_runner_smoke(tmp_path, monkeypatch):
  from experiments.configs import demo
  from experiments.studies import diversity

  c = ConfigDict(demo.get_config("smoke").to_dict())
  c.method, c.progress = "diversity", False
  c.diversity.kinds = "es,control"
  c.lock()
  # The random model never answers correctly; a length-parity verifier gives member-dependent
  # successes so the counts are not all zero (no model output is executed).
  monkeypatch.setattr(diversity.rewards, "is_correct", lambda text, ex, task: len(text) % 2 == 0)
  result = diversity.run(c, str(tmp_path))
  table = json.load(open(tmp_path / "diversity" / "table.json"))
  assert os.path.getsize(result["report"]) > 200
  rows = {r["kind"]: r for r in table["rows"]}
  for r in rows.values():
    assert np.asarray(r["counts"]).shape == (4, 2)
    assert all(np.isfinite([r["js_succ"], r["js_pol"], r["union_observed"]]))
    assert r["union_population"] >= r["union_single_policy"] - 1e-6
  assert abs(rows["control"]["js_pol"]) < 1e-4  # identical members: the mixture is each member
  assert table["global_step"] == 0


@pytest.mark.slow
def test_diversity_over_checkpoints(tmp_path, monkeypatch):
  """diversity.checkpoints: one row per checkpoint of the run, each around its own params and step
  key, with the centre policy's Pass@n gain over the first checkpoint, a table and the PNGs."""
  from es_jax import models
  from es_jax.persist.checkpoint import Checkpointer
  from experiments.configs import demo
  from experiments.runners import model_io
  from experiments.studies import diversity

  c = ConfigDict(demo.get_config("smoke").to_dict())
  c.method, c.progress = "diversity", False
  c.diversity.update(kinds="es,group", checkpoints=True, run=str(tmp_path / "run"), pol_samples=1)
  c.lock()
  model, _ = model_io.load_model(c.model, seed=c.seed)
  params = models.params(model)
  moved = jax.tree.map(lambda x: x + 0.5 * jax.numpy.ones_like(x), params)
  os.makedirs(tmp_path / "run")
  with open(tmp_path / "run" / "config.json", "w") as f:
    json.dump(c.to_dict(), f)
  per_step = c.data.prompts_per_step
  with Checkpointer(str(tmp_path / "run" / "checkpoints"), async_save=False) as ckpt:
    for step, p in ((1, params), (3, moved)):
      ckpt.save(
        step,
        state={"params": p},
        meta={"step": step, "data_position": step * per_step, "config": c.to_dict()},
        force=True,
      )
  monkeypatch.setattr(diversity.rewards, "is_correct", lambda text, ex, task: len(text) % 2 == 0)
  diversity.run(c, str(tmp_path / "out"))
  out = tmp_path / "out" / "diversity"
  table = json.load(open(out / "by_checkpoint.json"))
  rows = table["rows"]
  assert [r["checkpoint"] for r in rows] == [1, 3] and [r["global_step"] for r in rows] == [1, 3]
  assert rows[0]["pass@2_gain"] == 0.0
  assert rows[1]["pass@2_gain"] == pytest.approx(rows[1]["pass@2"] - rows[0]["pass@2"])
  assert all(np.isfinite(r["js_succ"]) for r in rows)
  # Different params give different completions: the measured rows differ between checkpoints.
  assert (rows[0]["pass@1"], rows[0]["js_succ"]) != (rows[1]["pass@1"], rows[1]["js_succ"])
  for png in ("js_by_checkpoint.png", "pass_gain_by_checkpoint.png"):
    assert os.path.getsize(out / png) > 1000
  assert "| 3 | 3 |" in open(out / "by_checkpoint.md").read()
  assert json.load(open(out / "table.json"))["global_step"] == 3  # the newest checkpoint's study
