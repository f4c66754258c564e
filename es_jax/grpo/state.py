"""The GRPO training state: float32 master weights, the clipped AdamW and its state.

`GRPOState` is what `es_jax.grpo.update.update_step` donates and returns and what a GRPO
checkpoint holds. `init_state` makes one from a model's params (a copy, in `master_dtype`),
`abstract_state` the same as shapes for lowering the step without arrays.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax.models.transformer import Params, cast_params


class GRPOState(NamedTuple):
  """Training state: an immutable pytree, donated to (and returned by) `update_step`."""

  params: Params
  opt_state: optax.OptState
  step: jax.Array  # int32 scalar: optimizer steps taken (one per mini-batch).


def _clipped_adamw(learning_rate, weight_decay, max_grad_norm, b1, b2, eps):
  return optax.chain(
    optax.clip_by_global_norm(max_grad_norm),
    optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
  )


def make_optimizer(
  learning_rate: float | optax.Schedule = 1e-6,
  *,
  weight_decay: float = 0.0,
  max_grad_norm: float = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
) -> optax.GradientTransformation:
  """AdamW after global-norm clipping: g ← g · min(1, max_grad_norm / ‖g‖₂), then AdamW.

  learning_rate, weight_decay and max_grad_norm live in the optimizer state
  (`optax.inject_hyperparams`), so they can be changed between steps without recompiling; a
  schedule is evaluated at the optimizer step count. Paper default: lr 1e-6 (docs/method.md §3).
  """
  for name, value in (("max_grad_norm", max_grad_norm), ("weight_decay", weight_decay)):
    if not value >= 0:
      raise ValueError(f"{name}={value} must be >= 0.")
  if not callable(learning_rate) and not learning_rate > 0:
    raise ValueError(f"learning_rate={learning_rate} must be > 0 (or an optax schedule).")
  return optax.inject_hyperparams(_clipped_adamw, static_args=("b1", "b2", "eps"))(
    learning_rate=learning_rate,
    weight_decay=weight_decay,
    max_grad_norm=max_grad_norm,
    b1=b1,
    b2=b2,
    eps=eps,
  )


def init_state(
  params: Params,
  optimizer: optax.GradientTransformation,
  *,
  mesh: Mesh | None = None,
  master_dtype: Any = jnp.float32,
) -> GRPOState:
  """A fresh state holding a *copy* of params, so the caller's arrays stay valid (e.g. as the
  frozen reference) although `update_step` donates the state.

  Mixed precision: the state's params are *master weights* in `master_dtype` (float32 by
  default), and so is the optimizer state, whatever dtype the model computes in. `update_step`
  runs forward and backward passes in the model config's dtype (bf16 for the paper's
  checkpoints) and applies float32 gradients to the float32 masters, as verl and TRL do. With
  `master_dtype=None` the params keep their own dtype: for a bf16 model that is pure-bf16 AdamW,
  whose updates at lr 1e-6 are mostly below bf16's resolution (the weights do not move).

  With `mesh`, arrays already on it keep their layout (e.g. es_jax.devices.sharding.shard_params
  over 'model'), the rest are replicated. Without, the state is committed to the params' device, as
  the states `update_step` returns are (a change of placement would recompile the step).
  """
  if mesh is None:
    device = next(iter(jax.tree.leaves(params)[0].devices()))
    place = functools.partial(jax.device_put, device=device)
  else:

    def place(x):
      on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
      return jax.device_put(
        x, canonical_sharding(x) if on_mesh else NamedSharding(mesh, PartitionSpec())
      )

  params = jax.tree.map(jnp.copy, params)
  if master_dtype is not None:
    params = cast_params(params, master_dtype)
  params = jax.tree.map(place, params)
  state = GRPOState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
  return jax.tree.map(place, state)


def abstract_state(
  params: Params, optimizer: optax.GradientTransformation, *, master_dtype: Any = jnp.float32
) -> GRPOState:
  """The `init_state` state as `jax.ShapeDtypeStruct`s (no arrays made; params may be abstract
  too), for `update_step(..., lower=True)`. Leaves of params with a sharding keep it; the
  optimizer moments take their params' sharding."""

  def master(x):
    dtype = x.dtype
    if master_dtype is not None and jnp.issubdtype(dtype, jnp.floating):
      dtype = jnp.dtype(master_dtype)
    return jax.ShapeDtypeStruct(x.shape, dtype, sharding=getattr(x, "sharding", None))

  params = jax.tree.map(master, params)
  opt_state = jax.eval_shape(optimizer.init, params)
  by_shape = {(p.shape, p.dtype): p.sharding for p in jax.tree.leaves(params)}
  meshes = [s.mesh for s in by_shape.values() if isinstance(s, NamedSharding)]
  scalar = NamedSharding(meshes[0], PartitionSpec()) if meshes else None

  def place(x):  # a moment has its param's shape; scalars (counts, hyperparameters) replicate
    sharding = by_shape.get((x.shape, x.dtype), scalar) if x.ndim else scalar
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  opt_state = jax.tree.map(place, opt_state)
  return GRPOState(params, opt_state, jax.ShapeDtypeStruct((), jnp.int32, sharding=scalar))


def canonical_sharding(x: jax.Array) -> Any:
  """x's sharding, with trailing Nones dropped from a NamedSharding's spec: P(None, 'model', None)
  and P(None, 'model') mean the same layout but would compile the step twice."""
  sharding = x.sharding
  if not isinstance(sharding, NamedSharding):
    return sharding
  spec = tuple(sharding.spec)
  while spec and spec[-1] is None:
    spec = spec[:-1]
  return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places every array of `tree` (params, optimizer state) on all devices of `mesh`."""
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))
