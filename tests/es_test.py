"""Tests for es_jax.es.gradient: explicit formula, shared noise, gradient alignment, optimisation,
jit."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from es_jax.es import fitness, noise
from es_jax.es import gradient as es
from es_jax.es.members import perturb_member

N = 8
SIGMA = 0.1


def _params(dtype=jnp.float32):
  return {
    "b": jnp.zeros((6,), dtype),  # vector leaf
    "w": jnp.ones((3, 5, 4), dtype),  # layer-stacked matrices [L, m, n]
  }


# Shared jitted direction: tests hit its cache instead of compiling again.
_direction_jit = jax.jit(es.es_update_direction, static_argnames=("spec",))


def _direction(params, weights, key, *, population_size, **kw):
  return _direction_jit(params, weights, key, spec=noise.NoiseSpec(population_size, **kw))


def _spec(**kw):
  return noise.NoiseSpec(N, **kw)


def _explicit(params, weights, key, **kw):
  """-(1/N) Σ_i w_i ε_i from materialised member noise, in float64."""
  spec = noise.NoiseSpec(len(weights), **kw)
  eps = [noise.materialize(noise.member_noise(params, key, i, spec)) for i in range(len(weights))]
  return jax.tree.map(
    lambda *e: -np.tensordot(np.asarray(weights, np.float64), np.stack(e), axes=1) / len(weights),
    *eps,
  )


CONFIGS = [
  dict(antithetic=False, rank=None, low_rank_vectors="full"),
  dict(antithetic=True, rank=None, low_rank_vectors="full"),
  dict(antithetic=False, rank=2, low_rank_vectors="full"),
  dict(antithetic=True, rank=2, low_rank_vectors="frozen"),
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"anti{kw['antithetic']}-rank{kw['rank']}")
def test_update_equals_explicit_formula(key, kw):
  params = _params()
  weights = jax.random.normal(jax.random.key(3), (N,))
  got = _direction(params, weights, key, population_size=N, **kw)
  want = _explicit(params, weights, key, **kw)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(-g, w, rtol=0, atol=1e-6)
  if kw["low_rank_vectors"] == "frozen":
    assert np.all(np.asarray(got["b"]) == 0)
  else:
    assert np.all(np.asarray(got["b"]) != 0)


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"anti{kw['antithetic']}-rank{kw['rank']}")
def test_update_regenerates_the_evaluation_noise(key, kw):
  # Weight N on member i alone: the direction is member i's noise. Full rank: bit-identical
  # (N is a power of two, so multiplying by N and by 1/N is exact).
  params = _params()
  for i in (0, 5):
    onehot = jnp.zeros((N,)).at[i].set(N)
    got = _direction(params, onehot, key, population_size=N, **kw)
    used = noise.materialize(noise.member_noise(params, key, i, _spec(**kw)))
    for g, u in zip(jax.tree.leaves(got), jax.tree.leaves(used), strict=True):
      if kw["rank"] is None:
        np.testing.assert_array_equal(g, u)
      else:
        np.testing.assert_allclose(g, u, rtol=0, atol=1e-6)


def _model_params():
  """tiny-qwen2 shapes (L = 2, qkv biases, tied head), random values (only shapes matter)."""
  from es_jax.models import get_config, param_shapes

  leaves, treedef = jax.tree.flatten(
    param_shapes(get_config("tiny-qwen2")), is_leaf=lambda x: isinstance(x, tuple)
  )
  return treedef.unflatten([jnp.full(shape, 0.5, jnp.float32) for shape in leaves])


STACKED_VECTORS = ("attn_norm", "mlp_norm", "bq", "bk", "bv")


@pytest.mark.slow
@pytest.mark.parametrize("low_rank_vectors", ["full", "frozen"])
def test_low_rank_update_on_model_params_with_stacked_vectors(key, low_rank_vectors):
  # The update regenerates each leaf with the same path-aware matrix/vector rule as
  # member_noise: layer-stacked norms and biases [L, n] are vectors, [L, m, n] are matrices.
  params = _model_params()
  kw = dict(antithetic=True, rank=2, low_rank_vectors=low_rank_vectors)
  weights = jax.random.normal(jax.random.key(3), (N,))
  got = _direction(params, weights, key, population_size=N, **kw)
  want = _explicit(params, weights, key, **kw)
  for (path, g), w in zip(
    jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
  ):
    assert g.dtype == jnp.float32 and g.shape == w.shape, path
    scale = max(float(np.max(np.abs(w))), 1e-30)
    np.testing.assert_allclose(-g, w, rtol=1e-6, atol=1e-6 * scale, err_msg=str(path))
  dense = _direction(params, weights, key, population_size=N, antithetic=True, rank=None)
  for name in STACKED_VECTORS:
    if low_rank_vectors == "frozen":
      assert np.all(np.asarray(got["layers"][name]) == 0), name
    else:
      # Vector leaves draw the full-rank noise in low rank too: the same direction.
      np.testing.assert_array_equal(got["layers"][name], dense["layers"][name], err_msg=name)
  assert np.all(np.asarray(got["final_norm"]) == 0) == (low_rank_vectors == "frozen")
  # The matrices are low rank: each layer's direction has rank <= (N / 2) * r = 8 < 64.
  assert np.linalg.matrix_rank(np.asarray(got["layers"]["wq"][0], np.float64), tol=1e-5) <= 8


def test_memory_is_not_population_times_params(key):
  # No array in the lowered update holds N copies of a leaf: noise is regenerated per member.
  params = {"big": jnp.zeros((4096,))}
  weights = jnp.ones((64,))
  hlo = (
    jax.jit(functools.partial(es.es_update_direction, spec=noise.NoiseSpec(64)))
    .lower(params, weights, key)
    .as_text()
  )
  sizes = [np.prod([int(d) for d in m.split("x")]) for m in re.findall(r"tensor<([\dx]+)x", hlo)]
  assert sizes and max(sizes) < 64 * 4096 / 8


def test_chain_with_sgd_is_the_paper_step_and_jit_does_not_retrace(key):
  params = _params()
  alpha = 0.5
  opt = optax.chain(es.es_gradient(noise.NoiseSpec(N)), optax.sgd(alpha))
  traces = []

  @jax.jit
  def step(params, state, r, k):
    traces.append(1)
    updates, state = opt.update(None, state, params, fitness=r, key=k)
    return optax.apply_updates(params, updates), state

  state = opt.init(params)
  r = jax.random.uniform(jax.random.key(4), (N,))
  new_params, state = step(params, state, r, key)
  # θ + (α/N) Σ z_i ε_i
  want = jax.tree.map(lambda p, d: p - alpha * d, params, _explicit(params, fitness.zscore(r), key))
  for g, w in zip(jax.tree.leaves(new_params), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
  assert int(state[0].count) == 1
  # Second call: new fitness and key, NaN fitness included; same trace, finite parameters.
  r2 = r.at[2].set(jnp.nan)
  newer, state = step(new_params, state, r2, jax.random.fold_in(key, 1))
  assert len(traces) == 1 and int(state[0].count) == 2
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(newer))


def test_shapings_are_wired_and_bf16_params(key):
  r = np.arange(N, dtype=np.float32)  # ranks 0..7
  z = (r - 3.5) / r.std()
  shape = jax.jit(fitness.shape_fitness, static_argnames=("population_size", "shaping"))
  for shaping, fit, want in [
    ("zscore", r, z),
    ("centered_rank", r, r / 7 - 0.5),
    ("per_prompt_zscore", np.stack([r, r, r], axis=1), z),  # [N, P]: equal columns -> zscore
    (jnp.negative, r, -r),
    (lambda x: x.at[1].set(jnp.nan), r, np.where(r == 1, 0, r)),  # non-finite weight -> 0
  ]:
    got = shape(fit, population_size=N, shaping=shaping)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got.dtype == jnp.float32
  # bf16 weights: float32 updates, and apply_updates keeps the weights' dtype.
  p16 = _params(jnp.bfloat16)
  direction = _direction(p16, z, key, population_size=N)
  want = _direction(_params(), z, key, population_size=N)
  for d, w in zip(jax.tree.leaves(direction), jax.tree.leaves(want), strict=True):
    assert d.dtype == jnp.float32
    np.testing.assert_array_equal(d, w)
  new = optax.apply_updates(p16, direction)
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(new))


def test_cosine_with_true_gradient(key):
  # f(θ) = -||θ - θ*||², d = 1000, one-point ES with z-score shaping. For f nearly linear over σ,
  # z_i ≈ u·ε_i (u the unit gradient), so (1/N) Σ z_i ε_i ≈ u + (an isotropic residual of squared
  # norm (d - 1)/N): cos ≈ (1 + d/N)^(-1/2). N = 8192 gives 0.944, with a standard deviation
  # of about 0.003 (chi-square residual with d - 1 dof; the alignment term ~ 1 ± 1/sqrt(2N)),
  # so the 0.9 threshold sits > 10 sd below. The curvature term σ²||ε||² varies by
  # σ² sqrt(2d) = 0.0045 against the linear term's σ||∇f|| ≈ 0.9: negligible.
  d, pop, sigma = 1000, 8192, 1e-2
  theta_star = jax.random.normal(jax.random.key(6), (d,))
  params = {"theta": jnp.zeros((d,))}

  def f(theta):
    return -jnp.sum(jnp.square(theta - theta_star))

  @jax.jit
  def estimate(params, key):
    spec = noise.NoiseSpec(pop)
    r = jax.vmap(lambda i: f(perturb_member(params, key, i, sigma, spec)["theta"]))(jnp.arange(pop))
    tx = es.es_gradient(spec)
    return tx.update(None, tx.init(params), params, fitness=r, key=key)[0]["theta"]

  g_es = -estimate(params, key)  # ascent direction
  g_true = jax.grad(f)(params["theta"])
  cos = jnp.dot(g_es, g_true) / (jnp.linalg.norm(g_es) * jnp.linalg.norm(g_true))
  assert 0.9 < float(cos) < 0.98


def _quadratic(theta):
  target = jnp.array([1.5, -2.0, 0.5, 1.0])
  return -jnp.sum(jnp.square(theta - target))


def _rosenbrock(theta):
  return -(
    100.0 * jnp.sum(jnp.square(theta[1:] - theta[:-1] ** 2)) + jnp.sum(jnp.square(1.0 - theta[:-1]))
  )


@functools.partial(jax.jit, static_argnames=("optimiser",))
def _optimise(problem, *, optimiser):
  """1000 ES steps from θ = 0 (N = 16, σ = 0.02); returns f per step. ``problem`` is traced
  (lax.switch) so one compile serves both objectives."""
  spec, sigma = noise.NoiseSpec(16), 0.02
  tx = optax.chain(es.es_gradient(spec), optimiser(0.02))

  def f(theta):
    return jax.lax.switch(problem, [_quadratic, _rosenbrock], theta)

  def step(carry, t):
    params, state = carry
    k = jax.random.fold_in(jax.random.key(1), t)
    members = jnp.arange(spec.population_size)
    r = jax.vmap(lambda i: f(perturb_member(params, k, i, sigma, spec)["theta"]))(members)
    updates, state = tx.update(None, state, params, fitness=r, key=k)
    params = optax.apply_updates(params, updates)
    return (params, state), f(params["theta"])

  params = {"theta": jnp.zeros((4,))}
  return jax.lax.scan(step, (params, tx.init(params)), jnp.arange(1000))[1]


@pytest.mark.parametrize("optimiser", [optax.sgd, optax.adam])
def test_sgd_and_adam_drive_f_up(optimiser):
  zero = jnp.zeros((4,))
  # Quadratic: f(0) = -7.5; the step size 0.02 bounds the final error to ~1e-3.
  quad = _optimise(0, optimiser=optimiser)
  assert float(_quadratic(zero)) == -7.5
  assert float(quad[-1]) > -0.05
  # Rosenbrock in 4-D: f(0) = -3; the curved valley is slow, measured about -0.1 to -0.3.
  rosen = _optimise(1, optimiser=optimiser)
  assert float(_rosenbrock(zero)) == -3.0
  assert float(jnp.mean(rosen[-100:])) > -1.0


def test_bad_inputs_name_the_value(key):
  params = _params()
  with pytest.raises(ValueError, match=r"population_size=7 is odd"):
    es.es_gradient(noise.NoiseSpec(7, antithetic=True))
  # No sigma (the update does not use σ; population.evaluate_population validates it, see
  # population_test), and no bare population size: such calls fail loudly.
  with pytest.raises(TypeError, match="NoiseSpec"):
    es.es_gradient(N)
  with pytest.raises(TypeError):
    es.es_gradient(noise.NoiseSpec(N), SIGMA)
  with pytest.raises(TypeError, match="antithetic"):
    es.es_gradient(noise.NoiseSpec(N), antithetic=True)
  with pytest.raises(ValueError, match=r"shaping='rank' is unknown"):
    es.es_gradient(noise.NoiseSpec(N), shaping="rank")
  with pytest.raises(ValueError, match=r"population_size=0"):
    es.es_gradient(noise.NoiseSpec(0))
  with pytest.raises(ValueError, match=r"rank=0"):
    es.es_gradient(noise.NoiseSpec(N, rank=0))
  tx = es.es_gradient(noise.NoiseSpec(N))
  with pytest.raises(ValueError, match=r"fitness has shape \(7,\), expected \(8,\)"):
    tx.update(None, tx.init(params), params, fitness=jnp.zeros((7,)), key=key)
  with pytest.raises(ValueError, match=r"needs params"):
    tx.update(None, tx.init(params), None, fitness=jnp.zeros((N,)), key=key)
  tx = es.es_gradient(noise.NoiseSpec(N), shaping="per_prompt_zscore")
  with pytest.raises(ValueError, match=r"fitness has shape \(8,\), expected \(8, P\)"):
    tx.update(None, tx.init(params), params, fitness=jnp.zeros((N,)), key=key)
  with pytest.raises(ValueError, match=r"returned shape \(\), expected \(8,\)"):
    fitness.shape_fitness(jnp.zeros((N,)), population_size=N, shaping=jnp.sum)
  with pytest.raises(ValueError, match=r"fitness_weights has shape \(4,\), expected \(8,\)"):
    es.es_update_direction(params, jnp.zeros((4,)), key, noise.NoiseSpec(N))


def test_precision_modes_update_as_the_numpy_reference(key):
  # One ES update of bf16 weights (LLM-like scale) in each former es.precision mode of the runner
  # (its es.master_dtype), against numpy/ml_dtypes: "fp32" keeps float32 masters
  # θ + (α/N) Σ z_i ε_i; "bf16" and "bf16_faithful" (master_dtype "") round that sum once to bf16,
  # so updates below half an ulp are lost.
  import ml_dtypes
  from ml_collections import ConfigDict

  from experiments.runners import es_runner
  from experiments.schema import check as config_check

  rng = np.random.default_rng(0)
  w16 = (0.02 * rng.standard_normal((3, 8, 16))).astype(ml_dtypes.bfloat16)
  base = {"b": jnp.asarray(np.ones(6), jnp.bfloat16), "w": jnp.asarray(w16)}
  cfg = dict(optimizer="sgd", learning_rate=2.5e-3, rank=0, population_size=N, sigma=1.5e-3)
  cfg = ConfigDict(dict(cfg, shaping="zscore", antithetic=False, low_rank_vectors="full"))
  rule = es_runner.make_update_rule(cfg)
  opt = rule(cfg.learning_rate)
  r = jnp.asarray(rng.standard_normal(N), jnp.float32)
  delta = jax.tree.map(lambda d: -cfg.learning_rate * d, _explicit(base, fitness.zscore(r), key))
  exact = jax.tree.map(lambda p, d: np.asarray(p, np.float64) + d, base, delta)
  got = {}
  for mode, (master_dtype, _) in config_check.ES_PRECISION_SPLIT.items():
    master = es_runner.master_weights(jax.tree.map(jnp.copy, base), master_dtype, jnp.bfloat16)
    state = {"params": master, "opt_state": opt.init(master)}
    sizes = es_runner.StepSizes(cfg.learning_rate)
    got[mode] = es_runner._apply(state, r, key, sizes, rule=rule)[0]["params"]
  for name in base:
    np.testing.assert_allclose(got["fp32"][name], exact[name], rtol=0, atol=1e-7)
    assert got["fp32"][name].dtype == jnp.float32
    rounded = exact[name].astype(np.float32).astype(ml_dtypes.bfloat16)
    for mode in ("bf16", "bf16_faithful"):
      assert got[mode][name].dtype == jnp.bfloat16
      same = np.asarray(got[mode][name]).view(np.uint16) == rounded.view(np.uint16)
      assert same.mean() > 0.99  # ties at half an ulp may round either way (summation order)
  # The modes really differ: bf16 rounding dropped updates that the masters kept.
  w32 = np.asarray(got["fp32"]["w"])
  assert np.mean(w32 != np.asarray(got["bf16"]["w"], np.float32)) > 0.5
  assert np.mean(np.asarray(got["bf16"]["w"]) == w16) > 0.01
  # α is traced: another learning rate is the same compiled program, and scales the step.
  fp32 = jax.tree.map(jnp.copy, {"w": base["w"].astype(jnp.float32)})
  state = {"params": fp32, "opt_state": opt.init(fp32)}
  lowered = [
    es_runner._apply.lower(state, r, key, es_runner.StepSizes(lr), rule=rule)
    for lr in (2.5e-3, 7.5e-3)
  ]
  assert lowered[0].as_text() == lowered[1].as_text()

  def step(lr):
    state = {"params": jax.tree.map(jnp.copy, fp32), "opt_state": opt.init(fp32)}
    sizes = es_runner.StepSizes(lr)
    return es_runner._apply(state, r, key, sizes, rule=rule)[0]["params"]["w"] - fp32["w"]

  steps = [step(2.5e-3), step(7.5e-3)]
  np.testing.assert_allclose(steps[1], 3 * steps[0], rtol=1e-4, atol=1e-9)


def test_noise_spec_is_frozen_hashable_and_validated_with_field_names():
  import dataclasses

  spec = noise.NoiseSpec(N, antithetic=True, rank=2, low_rank_vectors="frozen")
  assert spec == noise.NoiseSpec(N, True, 2, "frozen", "fp32")
  assert hash(spec) == hash(noise.NoiseSpec(N, True, 2, "frozen"))
  assert len({spec, noise.NoiseSpec(N, True, 2, "frozen"), noise.NoiseSpec(N)}) == 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.rank = 4
  for kwargs, field in [
    (dict(population_size=0), r"population_size=0"),
    (dict(population_size=True), r"population_size=True"),
    (dict(population_size=8.0), r"population_size=8.0"),
    (dict(population_size=7, antithetic=True), r"population_size=7 is odd"),
    (dict(population_size=N, antithetic=1), r"antithetic=1"),
    (dict(population_size=N, rank=0), r"rank=0"),
    (dict(population_size=N, rank=2.0), r"rank=2.0"),
    (dict(population_size=N, rank=2, low_rank_vectors="zero"), r"low_rank_vectors='zero'"),
    (dict(population_size=N, precision="bf16"), r"precision='bf16'"),
    (dict(population_size=N, rank=2, precision="bf16_faithful"), r"precision='bf16_faithful'"),
    (dict(population_size=N, precision="reference"), r"precision='reference'"),
    (
      dict(population_size=N, antithetic=True, precision="bf16_tensor_noise"),
      r"precision='bf16_tensor_noise' draws one noise per member",
    ),
    (dict(population_size=N, rank=2, precision="bf16_shared_noise"), r"rank=2"),
  ]:
    with pytest.raises(ValueError, match=field):
      noise.NoiseSpec(**kwargs)


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"anti{kw['antithetic']}-rank{kw['rank']}")
def test_one_spec_evaluation_and_update_agree(key, kw):
  # Members perturbed under a spec (as population.evaluate_population draws them) and
  # es_gradient(spec)'s update: with all weight on member i the update is -σ⁻¹ (θ_i - θ), member
  # i's own noise.
  spec = noise.NoiseSpec(N, **kw)
  params = {"b": jnp.zeros((6,)), "w": jnp.zeros((3, 5, 4))}
  tx = es.es_gradient(spec, shaping=lambda r: r)
  for i in (0, 5):
    member = perturb_member(params, key, i, SIGMA, spec)
    onehot = jnp.zeros((N,)).at[i].set(N)
    updates, _ = tx.update(None, tx.init(params), params, fitness=onehot, key=key)
    for u, m in zip(jax.tree.leaves(updates), jax.tree.leaves(member), strict=True):
      np.testing.assert_allclose(-u, np.asarray(m) / SIGMA, rtol=1e-5, atol=1e-5)
