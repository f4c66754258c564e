"""es_jax.es.population: members equal direct generation with noise.py's noise, sharded equals
single-device, chunk sizes agree, low-rank hook equals materialised noise, ES loop improves."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tiny_models import micro_config, random_params

from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.es import gradient as es
from es_jax.es import noise, population, reference_arithmetic
from es_jax.es.members import member, perturb_member

# Qwen2-like micro model: qkv biases (non-hook [L, n] leaves) and a tied head (hook via embed).
CONFIG = micro_config(qkv_bias=True, tie_embeddings=True, architecture="qwen2")
N, P, S, T = 8, 4, 8, 8
SIGMA = 0.05


def _params(seed=0):
  """Random weights ~ 1/sqrt(fan_in), norms ~ 1, biases ~ 0.1 (tests/tiny_models.py)."""
  return random_params(CONFIG, seed, vectors=0.1)


def _prompts():
  rng = np.random.RandomState(1)
  ids = rng.randint(0, CONFIG.vocab_size, (P, S)).astype(np.int32)
  mask = np.ones((P, S), bool)
  mask[1, :3] = False  # one left-padded row
  ids[~mask] = 0
  return ids, mask


def score_low_half(tokens, mask):
  """Toy reward: fraction of generated tokens in the lower half of the vocabulary."""
  hits = (tokens < CONFIG.vocab_size // 2) & mask
  return hits.sum(-1) / np.maximum(mask.sum(-1), 1)


SPEC_FIELDS = ("population_size", "antithetic", "rank", "low_rank_vectors", "precision")
DECODE_FIELDS = ("temperature", "top_p", "eos_ids", "pad_id")
SETTINGS_FIELDS = ("sigma", "members_per_chunk", "mesh", "share_sample_key")


def _evaluate(params, step_key, **overrides):
  """population.evaluate_population with this file's defaults; the noise settings among
  ``overrides`` make the run's ``NoiseSpec``, the population settings its
  ``PopulationSettings``, the decode settings its ``Decoding``."""
  ids, mask = _prompts()
  spec = {k: overrides.pop(k) for k in SPEC_FIELDS if k in overrides}
  decode = {k: overrides.pop(k) for k in DECODE_FIELDS if k in overrides}
  settings = dict(sigma=SIGMA, mesh=sharding.make_mesh())
  settings.update({k: overrides.pop(k) for k in SETTINGS_FIELDS if k in overrides})
  spec = noise.NoiseSpec(**{"population_size": N, **spec})
  kw = dict(
    settings=population.PopulationSettings(spec, config=CONFIG, **settings),
    step_key=step_key,
    decoding=sampling.Decoding(T, **decode),
    score_fn=score_low_half,
  )
  kw.update(overrides)
  return population.evaluate_population(params, ids, mask, **kw)


def _spec(**kw):
  return noise.NoiseSpec(N, **kw)


def _direct(member_params, key=None, temperature=0.0):
  ids, mask = _prompts()
  out = sampling.generate(
    member_params,
    ids,
    mask,
    sampling.Decoding(T, temperature),
    key=jax.random.key(0) if key is None else key,
    config=CONFIG,
  )
  return jax.tree.map(np.asarray, out)


def _assert_same_completions(a, b, rows=None):
  rows = slice(None) if rows is None else rows
  np.testing.assert_array_equal(a.tokens[rows], b.tokens)
  np.testing.assert_array_equal(a.mask[rows], b.mask)
  np.testing.assert_allclose(a.logprobs[rows], b.logprobs, atol=1e-5)
  np.testing.assert_allclose(a.entropy[rows], b.entropy, atol=1e-5)


def test_full_rank_members_match_direct_and_single_device(key):
  params = _params()
  fit, stats = _evaluate(params, key)
  assert fit.shape == (N,) and fit.dtype == np.float32
  assert stats.rewards.shape == (N, P) and stats.completions.tokens.shape == (N, P, T)
  np.testing.assert_array_equal(stats.local_members, np.arange(N))
  for i in (0, 5):
    ref = _direct(perturb_member(params, key, i, SIGMA, _spec()))
    _assert_same_completions(stats.completions, ref, rows=i)
    np.testing.assert_allclose(stats.rewards[i], score_low_half(ref.tokens, ref.mask), rtol=1e-6)
    np.testing.assert_allclose(stats.mean_length[i], ref.lengths.mean(), rtol=1e-6)
    ent = (ref.entropy * ref.mask).sum() / ref.mask.sum()
    np.testing.assert_allclose(stats.mean_entropy[i], ent, rtol=1e-5)
  np.testing.assert_allclose(fit, stats.rewards.mean(axis=1), rtol=1e-6)
  # The noise is applied: members differ from each other and from the base model.
  base = _direct(params)
  assert not np.array_equal(stats.completions.tokens[0], stats.completions.tokens[1])
  assert any(not np.array_equal(stats.completions.tokens[i], base.tokens) for i in range(N))

  # One device, members vmapped four at a time: the same population.
  fit1, stats1 = _evaluate(params, key, mesh=None, members_per_chunk=4)
  np.testing.assert_array_equal(fit1, fit)
  np.testing.assert_array_equal(stats1.rewards, stats.rewards)
  np.testing.assert_allclose(stats1.mean_entropy, stats.mean_entropy, rtol=1e-5)
  np.testing.assert_array_equal(stats1.mean_length, stats.mean_length)
  _assert_same_completions(stats1.completions, stats.completions)


@pytest.mark.slow
@pytest.mark.parametrize("precision", reference_arithmetic.MODES)
def test_in_place_members_are_those_of_reference_arithmetic(key, precision):
  # bf16 weights, so the modes' roundings (and Qiu et al.'s shape-shared noise) show.
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params())
  _, stats = _evaluate(params, key, mesh=None, precision=precision)
  for i in (0, N - 1):
    member = reference_arithmetic.perturb(params, noise.member_key(key, i), SIGMA, mode=precision)
    member = jax.tree.map(lambda x: x.astype(CONFIG.jnp_dtype), member)  # as members run
    _assert_same_completions(stats.completions, _direct(member), rows=i)


@pytest.mark.slow
def test_sampled_decoding_uses_per_member_keys(key):
  params = _params()
  sample_key = jax.random.key(7)
  _, stats = _evaluate(params, key, temperature=1.0, sample_key=sample_key)
  i = 3
  ref = _direct(
    perturb_member(params, key, i, SIGMA, _spec()),
    key=jax.random.fold_in(sample_key, i),
    temperature=1.0,
  )
  _assert_same_completions(stats.completions, ref, rows=i)
  # Common random numbers, members decoded together (one device, chunks of 4): every member
  # draws with sample_key itself.
  _, shared = _evaluate(
    params,
    key,
    temperature=1.0,
    sample_key=sample_key,
    mesh=None,
    members_per_chunk=4,
    share_sample_key=True,
  )
  ref = _direct(perturb_member(params, key, i, SIGMA, _spec()), key=sample_key, temperature=1.0)
  _assert_same_completions(shared.completions, ref, rows=i)
  assert not np.array_equal(shared.completions.tokens, stats.completions.tokens)
  with pytest.raises(ValueError, match="sample_key"):
    _evaluate(params, key, temperature=1.0)


def test_low_rank_hook_matches_materialised_noise_under_model_sharding(key):
  """EGGROLL members through the model hook, on a pop=4 x model=2 mesh with the matrices split
  over 'model', two members per chunk, antithetic: equal to generating with the materialised
  θ + σ a bᵀ/√r of noise.py."""
  params = _params()
  mesh = sharding.make_mesh(pop=4, model=2)
  sharded = sharding.shard_params(params, mesh, min_size=1)
  assert sharded["layers"]["w_up"].sharding.spec == jax.sharding.PartitionSpec(None, None, "model")
  kw = dict(rank=2, antithetic=True)
  fit, stats = _evaluate(sharded, key, mesh=mesh, members_per_chunk=2, **kw)
  for i in (2, 3, 6):  # an antithetic pair (±ε_1, one chunk) and a member on another device
    ref = _direct(perturb_member(params, key, i, SIGMA, _spec(**kw)))
    _assert_same_completions(stats.completions, ref, rows=i)
    np.testing.assert_allclose(fit[i], score_low_half(ref.tokens, ref.mask).mean(), rtol=1e-6)
  assert not np.array_equal(stats.completions.tokens[2], stats.completions.tokens[3])


@pytest.mark.parametrize("low_rank_vectors", ["full", "frozen"])
def test_low_rank_member_hook_forward_equals_materialised(key, low_rank_vectors):
  """low_rank_member on a model with qkv biases: only true matrices go through the hook; the
  layer-stacked vectors [L, n] (norms, biases) and final_norm get noise.py's vector noise added,
  and the hooked forward equals the forward at the materialised θ + σ ε_i."""
  from es_jax.models import forward, positions_from_mask

  params = _params()
  kw = dict(rank=2, antithetic=True, low_rank_vectors=low_rank_vectors)
  i, sigma = 3, 0.3  # a large σ, so a wrong perturbation cannot hide in the tolerance
  params_i, deltas, scale = member(params, key, i, sigma, _spec(**kw))
  assert set(deltas) == {"layers", "embed"}  # tied head: the embedding's hook covers both
  assert set(deltas["layers"]) == {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}
  np.testing.assert_allclose(scale, sigma / np.sqrt(2), rtol=1e-6)

  dense = noise.materialize(noise.member_noise(params, key, i, _spec(**kw)))
  ref = perturb_member(params, key, i, sigma, _spec(**kw))
  for name in ("attn_norm", "mlp_norm", "bq", "bk", "bv"):
    e = dense["layers"][name]
    np.testing.assert_array_equal(params_i["layers"][name], ref["layers"][name], err_msg=name)
    if low_rank_vectors == "frozen":
      np.testing.assert_array_equal(params_i["layers"][name], params["layers"][name])
    else:  # full-rank vector noise, the same draw as a full-rank population
      full = noise.member_noise(params, key, i, _spec(antithetic=True))["layers"][name]
      np.testing.assert_array_equal(e, full, err_msg=name)
  for name in deltas["layers"]:
    np.testing.assert_array_equal(params_i["layers"][name], params["layers"][name])

  ids, mask = _prompts()
  pos = positions_from_mask(jnp.asarray(mask))
  got, _ = forward(params_i, ids, pos, config=CONFIG, mask=mask, deltas=deltas, delta_scale=scale)
  want, _ = forward(ref, ids, pos, config=CONFIG, mask=mask)
  base, _ = forward(params, ids, pos, config=CONFIG, mask=mask)
  # 1e-5 of the logit scale: the hook sums x W^T + c (x b) a^T in another order than the
  # materialised x (W + c a b^T)^T, and with σ = 0.3 fp32 rounding reaches ~5e-6 of the scale.
  scale_tol = 1e-5 * float(np.abs(np.asarray(want)).max())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=scale_tol)
  assert np.max(np.abs(np.asarray(want) - np.asarray(base))) > 0.1


@pytest.mark.slow  # a training loop's behaviour, no reference
def test_es_loop_improves_reward_without_retracing():
  """evaluate + optax.chain(es_gradient, sgd): greedy reward of θ rises well above its start."""
  params = _params()
  alpha = 0.05
  opt = optax.chain(es.es_gradient(noise.NoiseSpec(N)), optax.sgd(alpha))
  opt_state = opt.init(params)
  update = jax.jit(lambda p, s, f, k: opt.update(None, s, p, fitness=f, key=k))

  def greedy_reward(p):
    out = _direct(p)
    return float(score_low_half(out.tokens, out.mask).mean())

  start = greedy_reward(params)
  run_key = jax.random.key(42)
  sizes = []
  for step in range(20):
    step_key = jax.random.fold_in(run_key, step)
    fit, _ = _evaluate(params, step_key)
    updates, opt_state = update(params, opt_state, jnp.asarray(fit), step_key)
    params = optax.apply_updates(params, updates)
    sizes.append(population.population_completions._cache_size())
  end = greedy_reward(params)
  assert sizes[-1] == sizes[0], f"population_completions retraced: cache sizes {sizes}"
  assert end >= start + 0.3, (start, end)


def test_bad_inputs_raise(key):
  params = _params()
  with pytest.raises(ValueError, match="population_size=6 must be divisible"):
    _evaluate(params, key, population_size=6)
  with pytest.raises(ValueError, match="members_per_chunk=3"):
    _evaluate(params, key, members_per_chunk=3)
  with pytest.raises(ValueError, match="population_size=7 is odd"):
    _evaluate(params, key, population_size=7, antithetic=True, mesh=None)
  with pytest.raises(ValueError, match="sigma=0.0"):
    _evaluate(params, key, sigma=0.0)
  # σ is validated here, where it is used (es_gradient has no sigma: the update does not use it).
  with pytest.raises(ValueError, match=r"sigma=-1 must be > 0"):
    _evaluate(params, key, sigma=-1)
  with pytest.raises(ValueError, match=r"sigma=nan must be > 0"):
    _evaluate(params, key, sigma=float("nan"))
  ids, mask = _prompts()
  kw = dict(step_key=key, score_fn=score_low_half)
  decoding = sampling.Decoding(T)
  with pytest.raises(TypeError, match="NoiseSpec"):  # the five noise settings: one spec
    population.PopulationSettings(N, SIGMA, CONFIG)
  settings = population.PopulationSettings(noise.NoiseSpec(N), SIGMA, CONFIG)
  with pytest.raises(TypeError, match="population_size"):  # noise settings as keywords
    population.evaluate_population(params, ids, mask, population_size=N, decoding=decoding, **kw)
  with pytest.raises(TypeError, match="population.PopulationSettings"):  # the population: one value
    population.evaluate_population(params, ids, mask, settings=N, decoding=decoding, **kw)
  with pytest.raises(TypeError, match="sampling.Decoding"):  # the decode settings: one value
    population.evaluate_population(params, ids, mask, settings=settings, decoding=T, **kw)
  with pytest.raises(TypeError, match="max_new_tokens"):
    population.evaluate_population(params, ids, mask, settings=settings, max_new_tokens=T, **kw)
  with pytest.raises(ValueError, match="precision"):
    _evaluate(params, key, rank=2, precision="bf16_faithful")
  with pytest.raises(ValueError, match="score_fn returned shape"):
    _evaluate(params, key, score_fn=lambda tokens, mask: np.zeros(2))
