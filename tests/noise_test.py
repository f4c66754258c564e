"""Tests for es_jax.es.noise: keys, regeneration, statistics, antithetic, low rank, precision."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from es_jax.es import gradient as es
from es_jax.es import noise, noise_blocks
from es_jax.es.members import perturb_member

# One tree (and few shapes) throughout: every distinct random shape costs an XLA compile.
RANK = 4


def _params():
  return {
    "v": jnp.zeros((2048,), jnp.float32),  # vector leaf (index 0: dict keys are sorted)
    "w": jnp.ones((4, 32, 16), jnp.float32),  # layer-stacked matrices [L, m, n] (index 1)
  }


def _spec(**kw):
  return noise.NoiseSpec(16, **kw)


def _stack(noises):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *noises)


def _normal(k, shape):
  """The documented full-rank draw, assembled block by block in numpy: block b is
  normal(fold_in(k, b), [B]) placed at s_b = min(b B, n - B) and supplies entries b B on."""
  n = int(np.prod(shape))
  size = min(noise_blocks.NOISE_BLOCK, n)
  out = np.full(n, np.nan, np.float32)
  for b in range(-(-n // size)):
    block = np.asarray(jax.random.normal(jax.random.fold_in(k, b), (size,), jnp.float32))
    start = min(b * size, n - size)
    out[b * size : start + size] = block[b * size - start :]
  assert not np.isnan(out).any()
  return out.reshape(shape)


def test_member_key_and_leaf_key_contract(key):
  params = _params()
  k3 = noise.member_key(key, 3)
  np.testing.assert_array_equal(
    jax.random.key_data(k3), jax.random.key_data(jax.random.fold_in(key, 3))
  )
  eps = noise.sample_noise(params, k3, _spec())
  # Stable leaf order: the order of tree_leaves_with_path.
  for l, (_, leaf) in enumerate(jax.tree_util.tree_leaves_with_path(params)):
    got = jax.tree.leaves(eps)[l]
    np.testing.assert_array_equal(got, _normal(jax.random.fold_in(k3, l), leaf.shape))
    assert got.dtype == jnp.float32
  low = noise.sample_noise(params, k3, _spec(rank=RANK))
  key_a, key_b = jax.random.split(jax.random.fold_in(k3, 1))
  np.testing.assert_array_equal(low["w"].a, _normal(key_a, (4, 32, RANK)))
  np.testing.assert_array_equal(low["w"].b, _normal(key_b, (4, 16, RANK)))
  np.testing.assert_array_equal(low["v"], eps["v"])


def test_multi_block_leaf_follows_the_block_rule_in_every_consumer(key):
  # 129 x 1024 = 2 full blocks + 1024 entries: the third block is shifted back to fit.
  assert 129 * 1024 == 2 * noise_blocks.NOISE_BLOCK + 1024
  params = {"big": jnp.full((129, 1024), 0.25, jnp.float32), "v": jnp.zeros((7,), jnp.float32)}
  k = noise.member_key(key, 5)
  want = _normal(jax.random.fold_in(k, 0), (129, 1024))
  np.testing.assert_array_equal(noise.sample_noise(params, k, _spec())["big"], want)
  # The blocks are distinct draws (no entry repeats its neighbour block's offset).
  flat = want.reshape(-1)
  assert not np.array_equal(
    flat[: noise_blocks.NOISE_BLOCK], flat[noise_blocks.NOISE_BLOCK : 2 * noise_blocks.NOISE_BLOCK]
  )
  # perturb adds block by block as it draws: the same values as adding the materialised noise.
  got = jax.jit(lambda p: perturb_member(p, key, 5, 0.5, _spec()))(params)
  np.testing.assert_array_equal(got["big"], np.float32(0.25) + np.float32(0.5) * want)
  # The update regenerates the blocks member by member: (1/N) sum_i w_i eps_i.
  w = jnp.asarray([0.5, -1.0, 2.0])
  direction = jax.jit(lambda p: es.es_update_direction(p, w, key, noise.NoiseSpec(3)))(params)[
    "big"
  ]
  explicit = (
    sum(
      float(w[i]) * _normal(jax.random.fold_in(noise.member_key(key, i), 0), (129, 1024))
      for i in range(3)
    )
    / 3
  )
  np.testing.assert_allclose(direction, explicit, atol=1e-6)


def test_regeneration_is_bit_identical_loop_and_jit_vmap(key):
  params = _params()
  loop = _stack([noise.member_noise(params, key, i, _spec(rank=RANK)) for i in range(4)])
  again = noise.member_noise(params, key, 2, _spec(rank=RANK))
  batched = jax.jit(jax.vmap(lambda i: noise.member_noise(params, key, i, _spec(rank=RANK))))(
    jnp.arange(4)
  )
  for x, y, z in zip(
    jax.tree.leaves(loop), jax.tree.leaves(again), jax.tree.leaves(batched), strict=True
  ):
    np.testing.assert_array_equal(x, z)
    np.testing.assert_array_equal(x[2], y)
  assert not np.array_equal(loop["v"][0], loop["v"][1])
  assert not np.array_equal(loop["w"].a[0], loop["w"].a[1])


def test_statistics_mean_std_and_correlations(key):
  # 16 members x 2 leaves of n = 2048 coordinates. Under H0 (iid N(0,1)): the mean of n values
  # has sd 1/sqrt(n), the sample std has sd ~ 1/sqrt(2n), and a sample correlation has sd
  # ~ 1/sqrt(n). Tolerances are 5 sd (two-sided p ~ 6e-7 each; the 496 correlations below still
  # give a family-wise false-alarm rate < 3e-4).
  params = _params()
  n = 2048
  eps = _stack([noise.member_noise(params, key, i, _spec()) for i in range(16)])
  x = np.concatenate([eps["v"], eps["w"].reshape(16, n)], axis=0).astype(np.float64)  # [32, n]
  assert np.all(np.abs(x.mean(axis=1)) < 5 / np.sqrt(n))
  assert np.all(np.abs(x.std(axis=1) - 1.0) < 5 / np.sqrt(2 * n))
  corr = np.corrcoef(x)  # between members, and between the two leaves of each member
  off_diag = corr[~np.eye(32, dtype=bool)]
  assert np.max(np.abs(off_diag)) < 5 / np.sqrt(n)
  all_values = x.ravel()
  assert abs(all_values.mean()) < 5 / np.sqrt(all_values.size)
  assert abs(all_values.std() - 1.0) < 5 / np.sqrt(2 * all_values.size)


def test_antithetic_pairs_are_exact_negatives(key):
  params = _params()
  for rank in (None, RANK):
    for j in range(2):
      even = noise.materialize(
        noise.member_noise(params, key, 2 * j, _spec(antithetic=True, rank=rank))
      )
      odd = noise.materialize(
        noise.member_noise(params, key, 2 * j + 1, _spec(antithetic=True, rank=rank))
      )
      # Pair j draws from member_key(step_key, j).
      plain = noise.materialize(
        noise.sample_noise(params, noise.member_key(key, j), _spec(rank=rank))
      )
      for e, o, p in zip(
        jax.tree.leaves(even), jax.tree.leaves(odd), jax.tree.leaves(plain), strict=True
      ):
        np.testing.assert_array_equal(e, -o)
        np.testing.assert_array_equal(e, p)


def test_low_rank_shapes_vectors_and_independent_layers(key):
  params = _params()
  eps = noise.sample_noise(params, key, _spec(rank=RANK))
  assert isinstance(eps["w"], noise.LowRankNoise)
  assert eps["w"].a.shape == (4, 32, RANK) and eps["w"].b.shape == (4, 16, RANK)
  assert eps["v"].shape == (2048,) and np.all(eps["v"] != 0)
  assert not np.allclose(eps["w"].a[0], eps["w"].a[1])
  frozen = noise.sample_noise(params, key, _spec(rank=RANK, low_rank_vectors="frozen"))
  np.testing.assert_array_equal(frozen["v"], np.zeros(2048))
  np.testing.assert_array_equal(frozen["w"].a, eps["w"].a)
  dense = noise.materialize(eps)
  want = np.einsum("lmr,lnr->lmn", eps["w"].a, eps["w"].b) / np.sqrt(RANK)
  np.testing.assert_allclose(dense["w"], want, rtol=1e-6, atol=1e-6)


def test_low_rank_entry_variance_is_one(key):
  # E = a b^T / sqrt(r): E[E^2] = 1, Var(E^2) = 2 + 6/r, and two entries sharing a row or a
  # column have Cov(E^2, E'^2) = 2/r. For one m x n matrix the mean of E^2 therefore has variance
  # (2 + 6/r + (m - 1 + n - 1) 2/r) / (m n); K independent matrices divide it by K.
  # Here m, n, r = 32, 16, 4 and K = 16 members x 4 layers: sd = 0.028; tolerance 5 sd.
  # Entries are uncorrelated (though dependent), so their mean has sd 1/sqrt(m n K).
  params = _params()
  m, n, num = 32, 16, 16 * 4
  e = np.stack(
    [
      np.asarray(noise.materialize(noise.member_noise(params, key, i, _spec(rank=RANK)))["w"])
      for i in range(16)
    ]
  ).astype(np.float64)
  sd = np.sqrt((2 + 6 / RANK + (m + n - 2) * 2 / RANK) / (m * n) / num)
  assert abs(np.mean(e**2) - 1.0) < 5 * sd
  assert abs(np.mean(e)) < 5 / np.sqrt(m * n * num)


def test_perturb_full_and_low_rank(key):
  params = _params()
  sigma = 0.01
  for rank in (None, RANK):
    got = noise.perturb(params, key, sigma, _spec(rank=rank))
    dense = noise.materialize(noise.sample_noise(params, key, _spec(rank=rank)))
    for p, e, g in zip(
      jax.tree.leaves(params), jax.tree.leaves(dense), jax.tree.leaves(got), strict=True
    ):
      np.testing.assert_allclose(g, p + sigma * e, rtol=0, atol=1e-7)
      assert g.dtype == p.dtype


def _bf16(x):
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def test_bf16_faithful_matches_documented_arithmetic(key):
  # LLM-like weights (std 0.02) and the paper's sigma = 1.5e-3: the step spans a few bf16 ulps, so
  # rounding the step first changes the result of some entries.
  rng = np.random.default_rng(0)
  w = _bf16(0.02 * rng.standard_normal((4, 32, 16)))
  sigma = 1.5e-3
  params = {"w": jnp.asarray(w)}
  eps = np.asarray(noise.sample_noise(params, key, _spec())["w"], np.float32)
  # Reference in numpy/ml_dtypes: round(w + round(sigma * eps)), products/sums in fp32.
  step = _bf16(np.float32(sigma) * eps)
  want = _bf16(w.astype(np.float32) + step.astype(np.float32))
  fp32_want = _bf16(w.astype(np.float32) + np.float32(sigma) * eps)
  eager = noise.perturb(params, key, sigma, _spec(precision="bf16_faithful"))["w"]
  jitted = jax.jit(lambda p, s: noise.perturb(p, key, s, _spec(precision="bf16_faithful")))(
    params, sigma
  )
  for got in (eager, jitted["w"]):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))
  got_fp32 = noise.perturb(params, key, sigma, _spec())["w"]
  assert got_fp32.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got_fp32).view(np.uint16), fp32_want.view(np.uint16))
  assert np.mean(want != fp32_want) > 0.01  # the modes differ, so the checks can tell them apart
  # For fp32 weights the two modes agree exactly.
  p32 = {"w": jnp.asarray(w, jnp.float32)}
  np.testing.assert_array_equal(
    noise.perturb(p32, key, sigma, _spec(precision="bf16_faithful"))["w"],
    noise.perturb(p32, key, sigma, _spec())["w"],
  )


def test_perturb_member_on_nnx_state(key):
  # The model's parameters come from nnx.split: leaves sit inside nnx.Param variables.
  from flax import nnx

  params = nnx.State({k: nnx.Param(v) for k, v in _params().items()})
  eps = noise.member_noise(params, key, 3, _spec(antithetic=True, rank=RANK))
  assert isinstance(eps["w"].get_value(), noise.LowRankNoise)
  got = perturb_member(params, key, 3, 0.5, _spec(antithetic=True, rank=RANK))
  want = noise.perturb(_params(), noise.member_key(key, 1), -0.5, _spec(rank=RANK))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"rank": 0}, "rank=0"),
    ({"rank": 2, "low_rank_vectors": "zero"}, "low_rank_vectors='zero'"),
    ({"precision": "bf16"}, "precision='bf16'"),
  ],
)
def test_bad_options_raise(key, kwargs, match):
  with pytest.raises(ValueError, match=match):
    noise.perturb(_params(), key, 0.1, _spec(**kwargs))


def _model_params(name="tiny-qwen2"):
  """Zeros shaped like a real model's params (only shapes matter for the noise)."""
  from es_jax.models import get_config, param_shapes

  def build(tree):
    return {
      k: build(v) if isinstance(v, dict) else jnp.zeros(v, jnp.float32) for k, v in tree.items()
    }

  return build(param_shapes(get_config(name)))


STACKED_VECTORS = ("attn_norm", "mlp_norm", "bq", "bk", "bv")
STACKED_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def test_is_matrix_leaf_is_path_aware():
  from jax.tree_util import DictKey, GetAttrKey

  # Stacked layers: one leading L axis, so [L, D] is a stack of vectors and [L, m, n] matrices.
  assert not noise.is_matrix_leaf(("layers", "attn_norm"), (2, 64))
  assert not noise.is_matrix_leaf((DictKey("layers"), DictKey("bq")), (2, 64))
  assert noise.is_matrix_leaf((DictKey("layers"), DictKey("wq")), (2, 64, 64))
  # nnx.State paths end in GetAttrKey('value'); only the top-level key matters.
  assert not noise.is_matrix_leaf((DictKey("layers"), DictKey("bk"), GetAttrKey("value")), (2, 8))
  # Top-level leaves and generic pytrees: a matrix iff ndim >= 2.
  assert noise.is_matrix_leaf((DictKey("embed"),), (256, 64))
  assert noise.is_matrix_leaf(("lm_head",), (64, 256))
  assert not noise.is_matrix_leaf(("final_norm",), (64,))
  assert noise.is_matrix_leaf(("w",), (32, 16)) and noise.is_matrix_leaf((), (4, 32, 16))
  assert not noise.is_matrix_leaf((), (2048,))
  # leaf_noise without a decision keeps the path-less rule; an explicit one overrides it.
  assert isinstance(noise.leaf_noise(jax.random.key(0), 0, (2, 8), rank=2), noise.LowRankNoise)
  vec = noise.leaf_noise(jax.random.key(0), 0, (2, 8), rank=2, is_matrix=False)
  np.testing.assert_array_equal(vec, noise.leaf_noise(jax.random.key(0), 0, (2, 8)))
  with pytest.raises(ValueError, match="is_matrix=True"):
    noise.leaf_noise(jax.random.key(0), 0, (8,), rank=2, is_matrix=True)


def test_leaf_plan_is_the_walk_every_consumer_shares():
  from es_jax.models.transformer import is_hook_leaf

  params = _model_params()  # tiny-qwen2: stacked layers with qkv biases
  values = jax.tree.leaves(params)
  full, got, _ = noise.leaf_plan(params, _spec())
  assert [leaf.index for leaf in full] == list(range(len(values)))
  assert all(leaf.kind == "dense" for leaf in full) and len(got) == len(values)
  kinds = {leaf.names: leaf.kind for leaf in noise.leaf_plan(params, _spec(rank=2))[0]}
  frozen = {
    leaf.names: leaf.kind
    for leaf in noise.leaf_plan(params, _spec(rank=2, low_rank_vectors="frozen"))[0]
  }
  for name in STACKED_MATRICES:
    assert kinds["layers", name] == frozen["layers", name] == "low_rank"
    assert is_hook_leaf(("layers", name))
  for name in STACKED_VECTORS:
    assert (kinds["layers", name], frozen["layers", name]) == ("dense", "frozen")
    assert not is_hook_leaf(("layers", name))
  assert kinds["embed",] == "low_rank" and kinds["final_norm",] == "dense"
  # Each plan entry's noise is the leaf's noise in sample_noise (same index, same kind).
  key = jax.random.key(3)
  low = jax.tree.leaves(noise.sample_noise(params, key, _spec(rank=2)), is_leaf=noise._is_low_rank)
  for leaf, e in zip(noise.leaf_plan(params, _spec(rank=2))[0], low, strict=True):
    assert isinstance(e, noise.LowRankNoise) == (leaf.kind == "low_rank"), leaf.names


def test_low_rank_on_model_params_stacked_vectors_are_vectors(key):
  # tiny-qwen2: L = 2, D = 64, q = 64, kv = 32, F = 128, V = 256, qkv biases, tied head.
  params = _model_params()
  num = 16
  full = [noise.member_noise(params, key, i, _spec()) for i in range(num)]
  low = [noise.member_noise(params, key, i, _spec(rank=RANK)) for i in range(num)]
  frozen = noise.member_noise(params, key, 0, _spec(rank=RANK, low_rank_vectors="frozen"))
  for name in STACKED_MATRICES:
    shape = params["layers"][name].shape
    for eps in (low[0], frozen):
      e = eps["layers"][name]
      assert isinstance(e, noise.LowRankNoise), name
      assert e.a.shape == (shape[0], shape[1], RANK) and e.b.shape == (shape[0], shape[2], RANK)
  assert isinstance(low[0]["embed"], noise.LowRankNoise)
  assert low[0]["embed"].a.shape == (256, RANK) and low[0]["embed"].b.shape == (64, RANK)
  np.testing.assert_array_equal(low[0]["final_norm"], full[0]["final_norm"])
  np.testing.assert_array_equal(frozen["final_norm"], np.zeros(64))

  corr2 = []
  for name in STACKED_VECTORS:
    shape = params["layers"][name].shape
    n = shape[1]
    assert not isinstance(low[0]["layers"][name], noise.LowRankNoise), name
    np.testing.assert_array_equal(frozen["layers"][name], np.zeros(shape))
    x = np.stack([np.asarray(eps["layers"][name], np.float64) for eps in low])  # [num, L, n]
    assert x.shape == (num, *shape), name
    # In low rank with "full" vectors the draw is the full-rank one, entry for entry.
    for i in (0, 7):
      np.testing.assert_array_equal(low[i]["layers"][name], full[i]["layers"][name])
    # iid N(0, 1): mean and std of num * L * n values within 5 sd.
    assert abs(x.mean()) < 5 / np.sqrt(x.size), name
    assert abs(x.std() - 1.0) < 5 / np.sqrt(2 * x.size), name
    # Layers uncorrelated: n * corr^2 of the two layers' rows is ~ chi2(1) per member. Low-rank
    # noise a b^T / sqrt(r) across layers would give corr^2 ~ 1/r, i.e. n * corr^2 ~ n / r >= 8.
    for i in range(num):
      corr2.append(n * np.corrcoef(x[i, 0], x[i, 1])[0, 1] ** 2)
  # Mean of 80 chi2(1) values: 1 +- 0.16 (sd); 2 is over 6 sd away.
  assert np.mean(corr2) < 2.0, np.mean(corr2)


def test_perturb_model_params_low_rank_vectors(key):
  params = _model_params()
  sigma = 0.5
  for lrv in ("full", "frozen"):
    got = perturb_member(params, key, 3, sigma, _spec(rank=RANK, low_rank_vectors=lrv))
    dense = noise.materialize(
      noise.member_noise(params, key, 3, _spec(rank=RANK, low_rank_vectors=lrv))
    )
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(dense), strict=True):
      np.testing.assert_allclose(g, sigma * e, rtol=0, atol=1e-6)
    bq = np.asarray(got["layers"]["bq"])
    if lrv == "frozen":
      np.testing.assert_array_equal(bq, np.zeros_like(bq))
    else:
      # Full-rank: the [L, n] bias is not a rank-r product (here its rows are independent).
      full = perturb_member(params, key, 3, sigma, _spec())
      np.testing.assert_array_equal(bq, full["layers"]["bq"])


def test_leaf_normal_equals_the_blocks_and_draws_on_shards(key):
  """noise.leaf_normal (the leaf's layout) is bit-identical to the block definition, a shifted
  last block included, and sharded over 'model' it equals the unsharded draw."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from es_jax.devices import sharding

  for shape in [(5,), (3, 7), (2, 40000), (65536,)]:  # (2, 40000): two blocks, the second shifted
    want = np.asarray(noise_blocks.normal(key, shape))
    np.testing.assert_array_equal(
      np.asarray(noise_blocks.leaf_normal(key, shape)), want, str(shape)
    )
  mesh = sharding.make_mesh(pop=4, model=2)
  draw = jax.jit(
    lambda k: noise_blocks.leaf_normal(k, (2, 40000)),
    out_shardings=NamedSharding(mesh, P(None, "model")),
  )
  np.testing.assert_array_equal(
    np.asarray(draw(key)), np.asarray(noise_blocks.normal(key, (2, 40000)))
  )
