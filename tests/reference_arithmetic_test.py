"""The reference code's ES arithmetic against numpy/ml_dtypes: shared noise, residues, update."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from es_jax import noise
from es_jax import reference_arithmetic as ref

BF16 = ml_dtypes.bfloat16
L, D, V, N, SIGMA, ALPHA = 3, 8, 16, 4, 1.5e-3, 5e-4


def _params():
  rng = np.random.default_rng(0)
  w = lambda *s: jnp.asarray((0.02 * rng.standard_normal(s)).astype(BF16))  # noqa: E731
  return {
    "embed": w(V, D),
    "final_norm": jnp.asarray(np.ones(D, BF16)),
    "layers": {"attn_norm": jnp.asarray(np.ones((L, D), BF16)), "wq": w(L, D, D)},
  }


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float32), tree)


def _bf16(x):  # round float32 to bf16 and back, as every bf16 tensor op does
  return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _bits_equal(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(
      np.asarray(g).view(np.uint16), np.asarray(w, BF16).view(np.uint16)
    )


def test_noise_is_shared_by_tensors_of_one_shape(key):
  eps = _np(ref.member_noise(_params(), noise.member_key(key, 0)))
  np.testing.assert_array_equal(eps["final_norm"], eps["layers"]["attn_norm"][1])  # both [D]
  np.testing.assert_array_equal(eps["layers"]["wq"][0], eps["layers"]["wq"][2])  # every layer
  assert not np.array_equal(eps["embed"][:D], eps["layers"]["wq"][0])  # other shape, other draw
  for e in jax.tree.leaves(eps):
    np.testing.assert_array_equal(e, _bf16(e))  # drawn in the weights' dtype
  other = _np(ref.member_noise(_params(), noise.member_key(key, 1)))
  assert not np.array_equal(other["embed"], eps["embed"])


def test_perturb_residue_and_update_match_numpy(key):
  params = _params()
  p = _np(params)
  eps = [_np(ref.member_noise(params, noise.member_key(key, i))) for i in range(N)]
  # A member: round(w + round(σ ε)).
  step = lambda w, e, s: _bf16(w + _bf16(np.float32(s) * e))  # noqa: E731
  want = jax.tree.map(lambda w, e: step(w, e, SIGMA), p, eps[2])
  _bits_equal(jax.jit(ref.perturb)(params, noise.member_key(key, 2), SIGMA), want)
  # Every member perturbs and restores in place, in order.
  w = p
  for e in eps:
    w = jax.tree.map(lambda x, ei: step(step(x, ei, SIGMA), ei, -SIGMA), w, e)
  got = jax.jit(ref.residue, static_argnums=2)(params, key, N, SIGMA)
  _bits_equal(got, w)
  moved = np.mean(np.asarray(got["layers"]["wq"], np.float32) != p["layers"]["wq"])
  assert 0 < moved < 0.5  # a residue in some entries: the reference's extra drift
  # The update, accumulated member by member in bf16.
  z = np.asarray([1.2, -0.3, 0.5, -1.4], np.float32)
  u = jax.tree.map(np.zeros_like, p)
  for zi, e in zip(z, eps, strict=True):
    u = jax.tree.map(lambda a, ei, zi=zi: _bf16(a + _bf16(zi * ei)), u, e)
  want = jax.tree.map(lambda x, a: step(x, _bf16(a / np.float32(N)), ALPHA), p, u)
  new = jax.jit(ref.update)(params, key, jnp.asarray(z), ALPHA)
  _bits_equal(new, want)
  assert all(np.asarray(x).dtype == BF16 for x in jax.tree.leaves(new))
  # Not the one-rounding update: the per-member roundings change some entries.
  exact = jax.tree.map(
    lambda x, *e: _bf16(x + ALPHA / N * sum(zi * ei for zi, ei in zip(z, e, strict=True))), p, *eps
  )
  pairs = zip(jax.tree.leaves(new), jax.tree.leaves(exact), strict=True)
  differ = [np.mean(np.asarray(a, np.float32) != b) for a, b in pairs]
  assert max(differ) > 0
