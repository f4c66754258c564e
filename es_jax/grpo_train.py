"""The GRPO train step: rollout (G samples per prompt), then a jitted, data-parallel update.

One GRPO step (docs/method.md §3), as experiments/grpo.py wires it:

  completions, batch = rollout(state.params, prompts, ..., num_generations=G)  # grpo_rollout.py
  host: decode → reward → rewards [P, G]
  batch, adv_stats = with_advantages(batch, rewards, std="population")
  state, metrics = update_step(state, batch, ref_params, ..., mini_batch_size, micro_batch_size)

`update_step` first scores the whole rollout under the rollout policy (old log-probs; not needed
with a single mini-batch) and the frozen reference (skipped when β = 0), then splits the B = P·G
sequences into B / mini_batch_size mini-batches, one optimizer step each (the paper: 64 prompts,
PPO mini-batch 32). Each mini-batch's gradient is accumulated over micro-batches with `lax.scan`,
weighted so that the sum equals the gradient of the loss over the whole mini-batch for every
aggregation.

Data parallelism: the batch's leading axis is sharded over the mesh axis `data_axis` ('pop', the
axis ES uses for its population); parameters are replicated, or split over another mesh axis
(they keep the layout they come with). Mini-batch i holds rows {i + k · num_mini}, a partition
that does not depend on the number of devices, so the sharded step equals the single-device step
(up to summation order); `micro_batch_size` counts rows per device.

Axis letters as in es_jax.grpo: P prompts, G generations, B = P·G sequences, S prompt + completion
tokens, T completion tokens; M mini-batch rows, n micro-batches per mini-batch, m micro-batch rows
on all devices together.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax import _checks
from es_jax.grpo import check_hyperparameters, grpo_loss
from es_jax.grpo_rollout import (  # noqa: F401  (re-exported: one import for a GRPO loop)
  GRPOBatch,
  _check_divisible,
  completion_logprobs,
  rollout,
  rollout_stats,
  shard_batch,
  with_advantages,
)
from es_jax.models.config import ModelConfig
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

  With `mesh`, arrays already on it keep their layout (e.g. es_jax.sharding.shard_params over
  'model'), the rest are replicated. Without, the state is committed to the params' device, as
  the states `update_step` returns are (a change of placement would recompile the step).
  """
  if mesh is None:
    device = next(iter(jax.tree.leaves(params)[0].devices()))
    place = functools.partial(jax.device_put, device=device)
  else:

    def place(x):
      on_mesh = isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
      return jax.device_put(x, _canonical(x) if on_mesh else NamedSharding(mesh, PartitionSpec()))

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


def update_step(
  state: GRPOState,
  batch: GRPOBatch,
  ref_params: Params | None = None,
  *,
  config: ModelConfig,
  optimizer: optax.GradientTransformation,
  mini_batch_size: int,
  micro_batch_size: int,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  beta: float = 0.0,
  aggregation: str = "seq_mean_token_mean",
  use_sampler_logp: bool = False,
  chunk_size: int | None = None,
  remat: bool = False,
  mesh: Mesh | None = None,
  data_axis: str = "pop",
  lower: bool = False,
) -> tuple[GRPOState, dict[str, jax.Array]] | jax.stages.Lowered:
  """B / mini_batch_size optimizer steps on one rollout, minimising `es_jax.grpo.grpo_loss`.

  Jitted with `state` donated: do not reuse the state passed in, and keep `ref_params` in buffers
  of their own (`init_state` copies). Numeric settings (eps_low, eps_high, beta) are traced; the
  rest are static.

  Args:
    state: the rollout policy's state; its params are π_old for the whole step.
    batch: from `rollout` + `with_advantages`, leading axis sharded over `data_axis` if `mesh`.
    ref_params: frozen reference π_ref for the k3 KL term; not needed (ignored) when beta == 0.
    config: the model config (static).
    optimizer: e.g. `make_optimizer(...)` (static: the same object reuses the compiled step).
    mini_batch_size: M rows (sequences, not prompts) per optimizer step; B % M == 0. The paper's
      32-prompt mini-batch with G = 8 is M = 256.
    micro_batch_size: rows per device per gradient-accumulation step; M % (m · devices) == 0.
    eps_low, eps_high, beta, aggregation: see `es_jax.grpo.grpo_loss`.
    use_sampler_logp: take π_old from the sampler (batch.sampler_logp) instead of recomputing it
      with a forward pass; cheaper, but sampler and training numerics may differ slightly. With
      a single mini-batch (M = B) no recomputation is needed: π_old is the policy being trained.
    chunk_size: vocabulary-chunked log-softmax (see `token_logprobs_from_logits`).
    remat: recompute every layer in the backward pass instead of saving its activations
      (gradient checkpointing): needed for long completions, where one layer's saved attention
      scores are [m, heads, S, S] float32; the gradient is the same, the step ~1/3 slower.
    mesh, data_axis: the device mesh and the batch's axis on it. Params (and the optimizer
      state) keep the shardings they come with: replicated (`replicate`), or split over another
      mesh axis (e.g. es_jax.sharding.shard_params over 'model'); the mesh needs Auto axes.
    lower: return the lowered program (`jax.stages.Lowered`) instead of running it. Every check
      here reads shapes only, so `state`, `batch` and `ref_params` may be abstract
      (`jax.ShapeDtypeStruct`s with shardings, e.g. `abstract_state`): compile the result for
      any target, a TPU topology included, and read its memory and cost analyses.

  Returns:
    (new state, metrics) with one entry per optimizer step ([B / M] float32 arrays): `loss`,
    `pg_loss`, `kl`, `ratio_mean`, `clip_frac`, `clip_frac_low`, `clip_frac_high`, `entropy`
    (policy entropy on the completion tokens), `grad_norm` (before clipping), `num_tokens` and,
    for `make_optimizer`, `learning_rate`.
  """
  rows, length = np.shape(batch.tokens)
  for name, shape in [("mask", (rows, length)), ("loss_mask", (rows, length - 1))] + [
    ("sampler_logp", (rows, length - 1)),
    ("advantages", (rows,)),
  ]:
    if np.shape(getattr(batch, name)) != shape:
      raise ValueError(
        f"batch.{name} has shape {np.shape(getattr(batch, name))}, expected {shape} for tokens "
        f"of shape {(rows, length)}."
      )
  if not 1 <= batch.completion_length < length:
    raise ValueError(f"batch.completion_length={batch.completion_length} not in [1, S={length}).")
  _checks.positive_int(mini_batch_size, "mini_batch_size")
  _checks.positive_int(micro_batch_size, "micro_batch_size")
  devices = 1 if mesh is None else mesh.shape[data_axis]
  _check_divisible(rows, "batch rows B", mini_batch_size, "mini_batch_size")
  _check_divisible(
    mini_batch_size, "mini_batch_size", micro_batch_size * devices, "micro_batch_size × devices"
  )
  beta_value = check_hyperparameters(aggregation, beta, eps_low, eps_high)
  if beta_value == 0.0:
    ref_params = None  # No KL term: skip the reference forward pass entirely.
  elif ref_params is None:
    raise ValueError(f"beta={beta} > 0 needs ref_params (the frozen reference policy).")
  program = _update_step.lower if lower else _update_step
  return program(
    state,
    batch,
    ref_params,
    jnp.asarray(eps_low, jnp.float32),
    jnp.asarray(eps_high, jnp.float32),
    jnp.asarray(beta, jnp.float32),
    config=config,
    optimizer=optimizer,
    mini_batch_size=mini_batch_size,
    micro_batch_size=micro_batch_size,
    aggregation=aggregation,
    use_sampler_logp=use_sampler_logp,
    chunk_size=chunk_size,
    remat=remat,
    mesh=mesh,
    data_axis=data_axis,
    # The step returns the state laid out exactly as it came in (say params split over a 'model'
    # axis), so donation reuses the buffers and the next call does not recompile.
    state_shardings=None if mesh is None else tuple(map(_canonical, jax.tree.leaves(state))),
  )


def _canonical(x: jax.Array) -> Any:
  """x's sharding, with trailing Nones dropped from a NamedSharding's spec: P(None, 'model', None)
  and P(None, 'model') mean the same layout but would compile the step twice."""
  sharding = x.sharding
  if not isinstance(sharding, NamedSharding):
    return sharding
  spec = tuple(sharding.spec)
  while spec and spec[-1] is None:
    spec = spec[:-1]
  return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


@functools.partial(
  jax.jit,
  # Static: shapes, the model and optimizer structure, and switches that change the program.
  static_argnames=(
    "config",
    "optimizer",
    "mini_batch_size",
    "micro_batch_size",
    "aggregation",
    "use_sampler_logp",
    "chunk_size",
    "remat",
    "mesh",
    "data_axis",
    "state_shardings",
  ),
  donate_argnames=("state",),
)
def _update_step(
  state,
  batch,
  ref_params,
  eps_low,
  eps_high,
  beta,
  *,
  config,
  optimizer,
  mini_batch_size,
  micro_batch_size,
  aggregation,
  use_sampler_logp,
  chunk_size,
  remat,
  mesh,
  data_axis,
  state_shardings,
):
  rows = batch.tokens.shape[0]
  T = batch.completion_length
  num_mini = rows // mini_batch_size
  devices = 1 if mesh is None else mesh.shape[data_axis]
  micro_rows = micro_batch_size * devices  # m: one accumulation step over all devices
  num_micro = mini_batch_size // micro_rows  # n

  def constrain(x, lead):  # keeps the row axis (after `lead` unsharded axes) on data_axis
    if mesh is None:
      return x
    spec = PartitionSpec(*([None] * lead), data_axis)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  def to_micro(x):  # [B, ...] -> [num_mini, n, m, ...]; row i + num_mini (l·n + j) -> [i, j, l]
    x = x.reshape(mini_batch_size, num_mini, *x.shape[1:]).swapaxes(0, 1)  # [num_mini, M, ...]
    x = x.reshape(num_mini, micro_rows, num_micro, *x.shape[2:]).swapaxes(1, 2)
    return constrain(x, 2)

  data = {
    "tokens": batch.tokens,
    "mask": batch.mask,
    "loss_mask": batch.loss_mask[:, -T:],  # [B, T]: the completion window
    "advantages": batch.advantages,
  }
  data = jax.tree.map(to_micro, data)
  score = functools.partial(completion_logprobs, config=config, completion_length=T)
  score = functools.partial(score, chunk_size=chunk_size)
  train_score = functools.partial(score, remat=remat)  # frozen passes need no backward

  compute_dtype = config.jnp_dtype

  def frozen_logp(p):  # [num_mini, n, m, T] log-probs under fixed params, one micro-batch at a time
    p = cast_params(p, compute_dtype)  # once, not per micro-batch
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), data)
    logp = jax.lax.map(lambda d: score(p, d["tokens"], d["mask"])[0], flat)
    return jax.lax.stop_gradient(logp.reshape(num_mini, num_micro, *logp.shape[1:]))

  if use_sampler_logp:
    data["old_logp"] = to_micro(batch.sampler_logp[:, -T:])
  elif num_mini > 1:
    data["old_logp"] = frozen_logp(state.params)
  # else: one mini-batch is trained at the rollout params, so π_old = stop_gradient(π_θ) exactly
  # and its forward pass is skipped.
  if ref_params is not None:
    data["ref_logp"] = frozen_logp(ref_params)

  # Normalisers of the mini-batch loss, so each micro-batch's loss is weighted to sum to it.
  tokens_per_micro = jnp.sum(data["loss_mask"], axis=-1, dtype=jnp.float32)  # [num_mini, n, m]
  if aggregation == "token_mean":
    count = jnp.sum(tokens_per_micro, axis=-1)  # [num_mini, n]
  else:
    count = jnp.full((num_mini, num_micro), float(micro_rows))
  data["weight"] = count / jnp.maximum(jnp.sum(count, axis=1, keepdims=True), 1.0)

  def micro_loss(params, d):
    logp, entropy = train_score(params, d["tokens"], d["mask"])  # [m, T]
    loss, metrics = grpo_loss(
      logp,
      d.get("old_logp", jax.lax.stop_gradient(logp)),
      d.get("ref_logp"),
      d["advantages"],
      d["loss_mask"],
      eps_low=eps_low,
      eps_high=eps_high,
      beta=beta if "ref_logp" in d else 0.0,
      aggregation=aggregation,
      entropy=entropy,
      max_length=T,
    )
    return loss * d["weight"], metrics

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
  token_metrics = ("kl", "ratio_mean", "clip_frac", "clip_frac_low", "clip_frac_high", "entropy")

  def mini_step(carry, mini):
    params, opt_state = carry
    # Forward and backward in the compute dtype. The gradient with respect to float32 masters
    # through a cast is this one upcast (the cast's transpose), so nothing is lost by taking it
    # with respect to the cast copy, made once per mini-batch instead of once per micro-batch.
    params_c = cast_params(params, compute_dtype)

    def accumulate(acc, d):
      d = {k: constrain(v, 0) if v.ndim > 0 else v for k, v in d.items()}
      (loss, m), grads = grad_fn(params_c, d)
      grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
      n = m["num_tokens"]
      sums = {k: m[k] * n for k in token_metrics}
      sums.update(loss=loss, pg_loss=m["pg_loss"] * d["weight"], num_tokens=n)
      return jax.tree.map(jnp.add, acc, (grads, sums)), None

    zero_sums = {k: jnp.zeros((), jnp.float32) for k in (*token_metrics, "loss", "pg_loss")}
    zero_sums["num_tokens"] = jnp.zeros((), jnp.float32)
    # float32 accumulators: summing many bfloat16 micro-batch gradients would lose precision.
    zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), zero_sums)
    (grads, sums), _ = jax.lax.scan(accumulate, zeros, mini)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    # Float32 gradients would promote low-precision moments (master_dtype=None on a bf16 model);
    # the scan carry must keep its dtypes. A no-op for float32 masters.
    opt_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_opt_state, opt_state)
    params = optax.apply_updates(params, updates)  # rounds once to the masters' dtype
    metrics = {k: sums[k] / jnp.maximum(sums["num_tokens"], 1.0) for k in token_metrics}
    metrics.update(
      loss=sums["loss"],
      pg_loss=sums["pg_loss"],
      num_tokens=sums["num_tokens"],
      grad_norm=optax.tree.norm(grads),
    )
    hyperparams = getattr(opt_state, "hyperparams", {})
    if "learning_rate" in hyperparams:
      metrics["learning_rate"] = jnp.asarray(hyperparams["learning_rate"], jnp.float32)
    return (params, opt_state), metrics

  (params, opt_state), metrics = jax.lax.scan(mini_step, (state.params, state.opt_state), data)
  new_state = GRPOState(params=params, opt_state=opt_state, step=state.step + num_mini)
  if state_shardings is not None:
    shardings = jax.tree.unflatten(jax.tree.structure(state), state_shardings)
    new_state = jax.lax.with_sharding_constraint(new_state, shardings)
  return new_state, metrics


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places every array of `tree` (params, optimizer state) on all devices of `mesh`."""
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))
