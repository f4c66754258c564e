"""The reference PyTorch ES code's arithmetic, for drift and sparsity figures made its way.

es_jax's own ES (es_jax.noise, es_jax.es) draws independent noise per tensor, perturbs members as
``θ + σ ε`` computed once, never touches θ while evaluating, and forms the update in float32. The
reference implementation of the study's ES does it differently, and with bf16 weights the
difference shows in how far the weights drift and which updates survive rounding:

* Noise is seeded per member and re-seeded for every tensor, so tensors of the same shape get the
  same noise (every layer's ``q_proj``, say) and it is drawn in the weights' dtype.
* A member perturbs the weights in place and restores them by subtracting the same step, each
  operation rounded to the weights' dtype: ``w ← round(round(w + s) − s)`` with
  ``s = round(σ · ε)``, which leaves a round-off residue in θ after every member.
* The update is accumulated member by member in the weights' dtype:
  ``u ← round(u + round(z_i ε_i))``, then ``u ← round(u / N)``, ``w ← round(w + round(α u))``.

This module implements exactly that (``round`` = rounding to the weights' dtype; every product
and sum computed in float32 first, as PyTorch does for bf16 tensors), with es_jax's keys: member
``i``'s noise for a tensor of per-layer shape ``s`` is ``round(normal(k, s))`` with
``k = member_key(step_key, i)`` folded with each dimension of ``s`` and then with ``len(s)``.
Layer-stacked leaves (``noise.STACKED_PREFIXES``) hold ``L`` tensors of shape ``s = shape[1:]``,
all given the same noise. For float32 weights every rounding is exact except the products.

Members are evaluated at ``round(θ + round(σ ε_i))`` from the step's θ (in parallel); the
reference evaluates them in sequence on one copy, so member ``i`` there also carries the
residues of members ``< i``: a few ulps in a few entries. The residues themselves are applied to
θ exactly (``residue``), after the evaluation and before the update.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from es_jax import noise as noise_lib


def _round(x: jax.Array, dtype: Any) -> jax.Array:
  """float32 ``x`` rounded to ``dtype``'s precision, kept float32 (XLA may not elide it)."""
  if jnp.dtype(dtype) == jnp.float32:
    return x
  info = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _tensor_shape(path: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(shape[1:]) if noise_lib.is_stacked_leaf(path) else tuple(shape)


def tensor_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 N(0, 1) of ``shape`` for one member key: the same for every tensor of that shape."""
  for d in shape:
    key = jax.random.fold_in(key, d)
  return jax.random.normal(jax.random.fold_in(key, len(shape)), shape, jnp.float32)


def member_noise(params: Any, key: jax.Array) -> Any:
  """Member noise per leaf, rounded to the leaf's dtype (float32 values), broadcast over a
  stacked leaf's layers; same-shape tensors share it (module docstring)."""
  drawn: dict[tuple, jax.Array] = {}

  def leaf(path, x):
    shape = _tensor_shape(path, x.shape)
    if (shape, x.dtype) not in drawn:
      drawn[shape, x.dtype] = _round(tensor_noise(key, shape), x.dtype)
    return jnp.broadcast_to(drawn[shape, x.dtype], x.shape)

  return jax.tree_util.tree_map_with_path(leaf, params)


def _step(params: Any, eps: Any, scale: jax.Array) -> Any:
  """``round(w + round(scale · ε))`` per leaf, in the leaf's dtype."""

  def leaf(w, e):
    s = _round(scale * e, w.dtype)
    return _round(w.astype(jnp.float32) + s, w.dtype).astype(w.dtype)

  return jax.tree.map(leaf, params, eps)


def perturb(params: Any, key: jax.Array, sigma: float | jax.Array) -> Any:
  """Member weights ``round(w + round(σ ε))`` for member key ``key``."""
  return _step(params, member_noise(params, key), jnp.asarray(sigma, jnp.float32))


def residue(params: Any, step_key: jax.Array, population_size: int, sigma: float | jax.Array):
  """θ after every member's in-place perturb and restore, in member order: for each ``i``,
  ``w ← round(round(w + s_i) − s_i)``, ``s_i = round(σ ε_i)``. Unchanged for float32 weights
  only where the sums are exact; the residue is the reference's extra drift."""
  sigma = jnp.asarray(sigma, jnp.float32)

  def body(i, w):
    eps = member_noise(w, noise_lib.member_key(step_key, i))
    return _step(_step(w, eps, sigma), eps, -sigma)

  return jax.lax.fori_loop(0, population_size, body, params)


def update(params: Any, step_key: jax.Array, weights: jax.Array, alpha: float | jax.Array) -> Any:
  """The reference's update with shaped fitness ``weights [N]`` (e.g. z-scores):
  ``u ← round(u + round(z_i ε_i))`` over members, ``u ← round(u / N)``,
  ``w ← round(w + round(α u))``; θ ← θ + (α/N) Σ z_i ε_i up to those roundings."""
  weights = jnp.asarray(weights, jnp.float32)
  n = weights.shape[0]

  def body(i, u):
    eps = member_noise(params, noise_lib.member_key(step_key, i))
    return jax.tree.map(
      lambda acc, e, w: _round(acc + _round(weights[i] * e, w.dtype), w.dtype), u, eps, params
    )

  zeros = jax.tree.map(lambda w: jnp.zeros(w.shape, jnp.float32), params)
  u = jax.lax.fori_loop(0, n, body, zeros)
  u = jax.tree.map(lambda acc, w: _round(acc / jnp.float32(n), w.dtype), u, params)
  alpha = jnp.asarray(alpha, jnp.float32)
  return _step(params, u, alpha)
