"""The in-place bf16 ES schemes (es_jax.es.reference_arithmetic) against numpy/ml_dtypes, bit for
bit.

The numpy side takes the float32 normals jax draws (``shape_noise``, ``noise.sample_noise``) and
the shaped fitness as inputs, and re-implements every cast, add, subtract and sum itself.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from tiny_models import micro_config, random_params

from es_jax.es import fitness, noise
from es_jax.es import reference_arithmetic as ref
from experiments.runners import es_runner

BF16 = ml_dtypes.bfloat16
N, SIGMA, ALPHA = 4, 1.5e-3, 5e-4
_spec = functools.partial(noise.NoiseSpec, N)
SHARED, TENSOR = "bf16_shared_noise", "bf16_tensor_noise"


def _params():
  """The micro Llama's params in bf16 (same-shape tensors: w_gate/w_up, wk/wv, the norms)."""
  return jax.tree.map(lambda x: jnp.asarray(x.astype(BF16)), random_params(micro_config(), xp=np))


def _f32(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float32), tree)


def _bf16(x):
  """float32 rounded to bf16 (nearest even) and back: what every bf16 tensor op ends with."""
  return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _bits_equal(got, want):
  paths = jax.tree_util.tree_leaves_with_path(got)
  for (path, g), w in zip(paths, jax.tree.leaves(want), strict=True):
    assert np.asarray(g).dtype == BF16, path
    np.testing.assert_array_equal(
      np.asarray(g).view(np.uint16), np.asarray(w, BF16).view(np.uint16), err_msg=str(path)
    )


def _numpy_noise(params, step_key, i, mode):
  """Member i's float32 normals per leaf, from jax; the numpy side does the rest."""
  key = noise.member_key(step_key, i)
  if mode == TENSOR:
    return _f32(noise.sample_noise(params, key, _spec()))

  def leaf(path, x):  # one draw per per-layer shape, broadcast over a stacked leaf's layers
    shape = x.shape[1:] if noise.path_names(path)[0] == "layers" else x.shape
    return np.broadcast_to(np.asarray(ref.shape_noise(key, shape)), x.shape)

  return jax.tree_util.tree_map_with_path(leaf, params)


def _numpy_step(w, e, scale, mode):
  """round(w + round(scale · ε)); Qiu et al.'s code draws ε in bf16 (rounded first)."""
  e = _bf16(e) if mode == SHARED else e
  return _bf16(w + _bf16(np.float32(scale) * e))


def _numpy_update(w, eps, z, mode):
  """One leaf's update from its noise ``eps [N, ...]`` and fitness weights ``z [N]``."""
  if mode == TENSOR:  # Δ summed in float32, c_i = (α/N) z_i, rounded once
    c = np.float32(ALPHA) / np.float32(N) * z
    delta = np.zeros(w.shape, np.float32)
    for ci, e in zip(c, eps, strict=True):
      delta = delta + ci * e
    return _bf16(w + _bf16(delta))
  u = np.zeros(w.shape, np.float32)  # summed member by member in bf16
  for zi, e in zip(z, eps, strict=True):
    u = _bf16(u + _bf16(zi * _bf16(e)))
  u = _bf16(u / np.float32(N))
  return _bf16(w + _bf16(np.float32(ALPHA) * u))


@pytest.mark.parametrize("mode", [SHARED, TENSOR])
def test_perturb_restore_update_cycle_matches_numpy(key, mode):
  params, theta = _params(), _f32(_params())
  eps = [_numpy_noise(params, key, i, mode) for i in range(N)]
  # Members, from the step's θ.
  perturb = jax.jit(lambda p, k, s: ref.perturb(p, k, s, mode=mode))
  for i in (0, N - 1):
    want = jax.tree.map(lambda w, e: _numpy_step(w, e, SIGMA, mode), theta, eps[i])
    _bits_equal(perturb(params, noise.member_key(key, i), SIGMA), want)
  # Every member perturbs and restores in place, in order: the residues stay in θ.
  w = theta
  for e in eps:
    w = jax.tree.map(
      lambda x, ei: _numpy_step(_numpy_step(x, ei, SIGMA, mode), ei, -SIGMA, mode), w, e
    )
  residue = jax.jit(ref.residue, static_argnums=2, static_argnames=("mode", "sharded"))
  got = residue(params, key, N, SIGMA, mode=mode)
  _bits_equal(got, w)
  if mode == TENSOR:  # the noise drawn in each leaf's layout: the same numbers
    _bits_equal(residue(params, key, N, SIGMA, mode=mode, sharded=True), w)
  pairs = zip(jax.tree.leaves(got), jax.tree.leaves(theta), strict=True)
  moved = [np.mean(np.asarray(g, np.float32) != t) for g, t in pairs]
  assert 0 < max(moved) < 0.5  # a residue in some entries: the in-place codes' extra drift
  # The update, from the shaped fitness, after the residues: the runner's step end to end.
  r = jnp.asarray([1.2, -0.3, 0.5, -1.4], jnp.float32)
  z = np.asarray(fitness.zscore(r), np.float32)
  stacked = jax.tree.map(lambda *e: np.stack(e), *eps)  # [N, ...] per leaf
  want = jax.tree.map(lambda x, e: _numpy_update(x, e, z, mode), w, stacked)
  _bits_equal(jax.jit(ref.update, static_argnames=("mode",))(got, key, z, ALPHA, mode=mode), want)
  state = {"params": params, "opt_state": ()}
  rule = es_runner.UpdateRule(noise.NoiseSpec(N, precision=mode), "zscore", False, "sgd")
  sizes = es_runner.StepSizes(jnp.float32(ALPHA), jnp.float32(SIGMA))
  applied, ratio = es_runner._apply(state, r, key, sizes, rule=rule)
  assert 0 < float(ratio) < 1  # the step's ‖Δθ‖/‖θ‖, residues and update together
  _bits_equal(applied["params"], want)


def test_tensor_noise_is_per_tensor_and_shared_noise_per_shape(key):
  # σ = 1 on zero weights: a member is round(ε), the mode's noise itself.
  zeros = jax.tree.map(jnp.zeros_like, _params())
  member = {m: _f32(ref.perturb(zeros, noise.member_key(key, 3), 1.0, mode=m)) for m in ref.MODES}
  for a, b in (("w_gate", "w_up"), ("wk", "wv"), ("attn_norm", "mlp_norm")):
    layers = {m: member[m]["layers"] for m in ref.MODES}
    assert layers[SHARED][a].shape == layers[SHARED][b].shape
    np.testing.assert_array_equal(layers[SHARED][a], layers[SHARED][b])
    assert np.mean(layers[TENSOR][a] != layers[TENSOR][b]) > 0.9
  np.testing.assert_array_equal(
    member[SHARED]["final_norm"], member[SHARED]["layers"]["mlp_norm"][1]
  )
  np.testing.assert_array_equal(
    member[SHARED]["layers"]["wq"][0], member[SHARED]["layers"]["wq"][1]
  )
  assert np.mean(member[TENSOR]["layers"]["wq"][0] != member[TENSOR]["layers"]["wq"][1]) > 0.9
  # The per-tensor noise is es_jax's own (the "fp32" mode's ε), rounded once.
  eps = _f32(noise.sample_noise(zeros, noise.member_key(key, 3), _spec()))
  for m, e in zip(jax.tree.leaves(member[TENSOR]), jax.tree.leaves(eps), strict=True):
    np.testing.assert_array_equal(m, _bf16(e))


def test_unknown_mode_is_refused_naming_it(key):
  with pytest.raises(ValueError, match="mode='reference'"):
    ref.perturb(_params(), key, SIGMA, mode="reference")
