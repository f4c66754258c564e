"""Two public codes' in-place bf16 ES arithmetic, for drift and sparsity figures made their way.

es_jax's own ES (es_jax.es.noise, es_jax.es.gradient) perturbs members as ``θ + σ ε`` computed once,
never
touches θ while evaluating, and forms the update in float32. Public PyTorch ES codes perturb the
weights in place and restore them by subtracting the same step, each operation rounded to the
weights' dtype, so with bf16 weights every member leaves a round-off residue in θ, and how the
update is summed decides which small updates survive. Two schemes, each an ``es.arithmetic`` mode
(``MODES``; ``round`` = rounding to the weights' dtype, products and sums in float32 first, as
PyTorch computes bf16 tensor ops):

* ``"bf16_shared_noise"``: Qiu et al.'s ES code (arXiv 2509.24372). Noise is seeded per member
  and re-seeded for every tensor, so tensors of the same shape get the same noise (every layer's
  ``q_proj``, say), drawn in the weights' dtype. With ``s = round(σ · round(ε))``:
  perturb ``w ← round(w + s)``, restore ``w ← round(w − s)``; the update is accumulated member by
  member in the weights' dtype, ``u ← round(u + round(z_i · round(ε_i)))``, then
  ``u ← round(u / N)``, ``w ← round(w + round(α u))``. Here member ``i``'s noise for a tensor of
  per-layer shape ``s`` is ``round(normal(k, s))``, ``k = member_key(step_key, i)`` folded with
  each dimension of ``s`` and then with ``len(s)``. Layer-stacked leaves
  (``noise.STACKED_PREFIXES``) hold ``L`` tensors of shape ``shape[1:]``, all given that noise.
* ``"bf16_tensor_noise"``: the public reproduction of arXiv 2608.27351 (``understanding-es``,
  ``src/es_reproduction/worker.py``). Independent float32 noise per tensor, scaled by σ in float32
  and rounded once: ``s = round(σ ε)``, perturb ``w ← round(w + s)``, restore
  ``w ← round(w + round(−σ ε)) = round(w − s)``; the update is summed in float32 and rounded once,
  ``Δ = Σ_i c_i ε_i`` (float32, member by member, ``c_i = (α/N) z_i``),
  ``w ← round(w + round(Δ))``. The reproduction makes the noise independent per tensor by mixing
  the seed with a hash of the tensor's name; es_jax uses its own key-derived per-tensor noise
  instead, ``ε_i = noise.sample_noise(θ, member_key(step_key, i), spec)`` (leaf ``l``'s key is
  ``noise.leaf_key(member_key, l)``): the ε of the default "fp32" mode, so the two differ only in
  arithmetic. Its members are ``noise.perturb`` with ``precision="bf16_faithful"``.

For float32 weights every rounding is exact except the products and sums.

Members are evaluated at ``round(θ + s_i)`` from the step's θ (in parallel); the public codes
evaluate them in sequence on one copy, so member ``i`` there also carries the residues of
members ``< i``: a few ulps in a few entries. The residues themselves are applied to θ exactly
(``residue``), after the evaluation and before the update.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from es_jax.es import noise as noise_lib

SHARED_NOISE, TENSOR_NOISE = noise_lib.IN_PLACE_PRECISIONS
MODES = noise_lib.IN_PLACE_PRECISIONS
# The per-tensor mode's arithmetic on one member key at a time (population size not read).
_FAITHFUL = noise_lib.NoiseSpec(1, precision="bf16_faithful")
_FULL_RANK = noise_lib.NoiseSpec(1)


def _round(x: jax.Array, dtype: Any) -> jax.Array:
  """float32 ``x`` rounded to ``dtype``'s precision, kept float32 (XLA may not elide it)."""
  if jnp.dtype(dtype) == jnp.float32:
    return x
  info = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"mode={mode!r} is invalid: use one of {MODES}.")


def _tensor_shape(path: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(shape[1:]) if noise_lib.is_stacked_leaf(path) else tuple(shape)


def shape_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 N(0, 1) of ``shape`` for one member key: the same for every tensor of that shape."""
  for d in shape:
    key = jax.random.fold_in(key, d)
  return jax.random.normal(jax.random.fold_in(key, len(shape)), shape, jnp.float32)


def shared_noise(params: Any, key: jax.Array) -> Any:
  """``"bf16_shared_noise"`` member noise per leaf, rounded to the leaf's dtype (float32 values),
  broadcast over a stacked leaf's layers; same-shape tensors share it (module docstring)."""
  drawn: dict[tuple, jax.Array] = {}

  def leaf(path, x):
    shape = _tensor_shape(path, x.shape)
    if (shape, x.dtype) not in drawn:
      drawn[shape, x.dtype] = _round(shape_noise(key, shape), x.dtype)
    return jnp.broadcast_to(drawn[shape, x.dtype], x.shape)

  return jax.tree_util.tree_map_with_path(leaf, params)


def _step(params: Any, eps: Any, scale: jax.Array) -> Any:
  """``round(w + round(scale · ε))`` per leaf, in the leaf's dtype."""

  def leaf(w, e):
    s = _round(scale * e, w.dtype)
    return _round(w.astype(jnp.float32) + s, w.dtype).astype(w.dtype)

  return jax.tree.map(leaf, params, eps)


def _tensor_step(params: Any, key: jax.Array, scale: jax.Array, sharded: bool) -> Any:
  """``round(w + round(scale · ε))`` with es_jax's per-tensor ε of member key ``key``."""
  return noise_lib.perturb(params, key, scale, _FAITHFUL, sharded=sharded)


def perturb(
  params: Any, key: jax.Array, sigma: float | jax.Array, *, mode: str, sharded: bool = False
) -> Any:
  """Member weights ``round(w + round(σ ε))`` for member key ``key`` under ``mode``.

  ``sharded`` (``"bf16_tensor_noise"`` only): draw the noise in each leaf's layout
  (``noise.perturb``); the same numbers.
  """
  _check_mode(mode)
  sigma = jnp.asarray(sigma, jnp.float32)
  if mode == TENSOR_NOISE:
    return _tensor_step(params, key, sigma, sharded)
  return _step(params, shared_noise(params, key), sigma)


def residue(
  params: Any,
  step_key: jax.Array,
  population_size: int,
  sigma: float | jax.Array,
  *,
  mode: str,
  sharded: bool = False,
) -> Any:
  """θ after every member's in-place perturb and restore, in member order: for each ``i``,
  ``w ← round(round(w + s_i) − s_i)``, ``s_i = round(σ ε_i)`` (``mode``'s noise and roundings).
  The residue is the public codes' extra drift; float32 weights keep one only where the sums are
  inexact."""
  _check_mode(mode)
  sigma = jnp.asarray(sigma, jnp.float32)

  def body(i, w):
    key = noise_lib.member_key(step_key, i)
    if mode == TENSOR_NOISE:
      return _tensor_step(_tensor_step(w, key, sigma, sharded), key, -sigma, sharded)
    eps = shared_noise(w, key)
    return _step(_step(w, eps, sigma), eps, -sigma)

  return jax.lax.fori_loop(0, population_size, body, params)


def update(
  params: Any,
  step_key: jax.Array,
  weights: jax.Array,
  alpha: float | jax.Array,
  *,
  mode: str,
  sharded: bool = False,
) -> Any:
  """The update with shaped fitness ``weights [N]`` (e.g. z-scores) under ``mode``;
  θ ← θ + (α/N) Σ z_i ε_i up to its roundings (module docstring).

  ``"bf16_shared_noise"``: ``u ← round(u + round(z_i ε_i))`` over members, ``u ← round(u / N)``,
  ``w ← round(w + round(α u))``. ``"bf16_tensor_noise"``: ``Δ ← Δ + c_i ε_i`` in float32 with
  ``c_i = (α/N) z_i`` (drawn block by block, ``noise.perturb``), ``w ← round(w + round(Δ))``.
  """
  _check_mode(mode)
  weights = jnp.asarray(weights, jnp.float32)
  alpha = jnp.asarray(alpha, jnp.float32)
  n = weights.shape[0]
  zeros = jax.tree.map(lambda w: jnp.zeros(w.shape, jnp.float32), params)
  if mode == TENSOR_NOISE:
    coef = alpha / jnp.float32(n) * weights  # [N]

    def add_member(i, delta):
      key = noise_lib.member_key(step_key, i)
      return noise_lib.perturb(delta, key, coef[i], _FULL_RANK, sharded=sharded)  # Δ + c_i ε_i

    delta = jax.lax.fori_loop(0, n, add_member, zeros)
    return _step(params, delta, jnp.float32(1.0))

  def body(i, u):
    eps = shared_noise(params, noise_lib.member_key(step_key, i))
    return jax.tree.map(
      lambda acc, e, w: _round(acc + _round(weights[i] * e, w.dtype), w.dtype), u, eps, params
    )

  u = jax.lax.fori_loop(0, n, body, zeros)
  u = jax.tree.map(lambda acc, w: _round(acc / jnp.float32(n), w.dtype), u, params)
  return _step(params, u, alpha)
