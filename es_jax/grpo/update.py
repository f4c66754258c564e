"""The GRPO update step: a jitted, data-parallel, mini/micro-batched optimisation on one rollout.

One GRPO step (docs/method.md §3), as experiments/runners/grpo_runner.py wires it:

  completions, batch = rollout(state.params, prompts, ..., decoding=decoding)  # grpo_rollout.py
  host: decode → reward → rewards [P, G]
  batch, adv_stats = with_advantages(batch, rewards, std="population")
  state, metrics = update_step(state, batch, ref_params, settings, config=..., optimizer=...)

`update_step` first scores the whole rollout under the rollout policy (old log-probs; not needed
with a single mini-batch) and the frozen reference (skipped when β = 0), then splits the B = P·G
sequences into B / mini_batch_size mini-batches, one optimizer step each (the paper: 64 prompts,
PPO mini-batch 32). Each mini-batch's gradient is accumulated over micro-batches with `lax.scan`,
weighted so that the sum equals the gradient of the loss over the whole mini-batch for every
aggregation. `UpdateSettings` holds the loss's and the batching's settings.

Data parallelism: the batch's leading axis is sharded over the mesh axis `DATA_AXIS` ('pop', the
axis ES uses for its population); parameters are replicated, or split over another mesh axis
(they keep the layout they come with). Mini-batch i holds rows {i + k · num_mini}, a partition
that does not depend on the number of devices, so the sharded step equals the single-device step
(up to summation order); `micro_batch_size` counts rows per device.

The rollout's and the state's names are re-exported here (one import for a GRPO loop).

Axis letters as in es_jax.grpo.loss: P prompts, G generations, B = P·G sequences, S prompt +
completion
tokens, T completion tokens; M mini-batch rows, n micro-batches per mini-batch, m micro-batch rows
on all devices together.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax import _checks
from es_jax.grpo.loss import LossSettings, grpo_loss  # noqa: F401  (LossSettings re-exported)
from es_jax.grpo.rollout import (  # noqa: F401  (re-exported: one import for a GRPO loop)
  DATA_AXIS,
  GRPOBatch,
  _check_divisible,
  completion_logprobs,
  rollout,
  rollout_stats,
  shard_batch,
  with_advantages,
)
from es_jax.grpo.state import (  # noqa: F401  (re-exported: one import for a GRPO loop)
  GRPOState,
  abstract_state,
  canonical_sharding,
  init_state,
  make_optimizer,
  replicate,
)
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import Params, cast_params


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class UpdateSettings:
  """How `update_step` trains on one rollout: the loss, the batching, what it recomputes.

  One value, validated on construction: a ValueError whose message starts with the field
  (``UpdateSettings.micro_batch_size=0 must be ...``). A pytree, as
  `es_jax.decode.sampling.Decoding`: the loss's numbers (`LossSettings`' ``eps_low``, ``eps_high``
  and ``beta``) are its leaves, traced in the jitted step (a new value does not recompile); the
  other fields are static.

  Attributes:
    mini_batch_size: M rows (sequences, not prompts) per optimizer step; B % M == 0. The paper's
      32-prompt mini-batch with G = 8 is M = 256.
    micro_batch_size: rows per device per gradient-accumulation step; M % (m · devices) == 0.
    loss: the clip, KL and aggregation settings (`es_jax.grpo.loss.LossSettings`), passed whole
      to `grpo_loss`; β = 0 skips the reference.
    use_sampler_logp: take π_old from the sampler (batch.sampler_logp) instead of recomputing it
      with a forward pass; cheaper, but sampler and training numerics may differ slightly. With
      a single mini-batch (M = B) no recomputation is needed: π_old is the policy being trained.
    chunk_size: vocabulary-chunked log-softmax (see `token_logprobs_from_logits`), or None.
    remat: recompute every layer in the backward pass instead of saving its activations
      (gradient checkpointing): needed for long completions, where one layer's saved attention
      scores are [m, heads, S, S] float32; the gradient is the same, the step ~1/3 slower.
  """

  mini_batch_size: int
  micro_batch_size: int
  loss: LossSettings = LossSettings()
  use_sampler_logp: bool = False
  chunk_size: int | None = None
  remat: bool = False

  def __post_init__(self):
    name = type(self).__name__
    _checks.positive_int(self.mini_batch_size, f"{name}.mini_batch_size")
    _checks.positive_int(self.micro_batch_size, f"{name}.micro_batch_size")
    if self.chunk_size is not None:
      _checks.positive_int(self.chunk_size, f"{name}.chunk_size")
    if not isinstance(self.loss, LossSettings):
      raise ValueError(f"{name}.loss={self.loss!r} must be an es_jax.grpo.loss.LossSettings.")
    object.__setattr__(self, "use_sampler_logp", bool(self.use_sampler_logp))
    object.__setattr__(self, "remat", bool(self.remat))

  def check_rows(self, rows: int, devices: int = 1) -> None:
    """Raises ValueError unless M divides the B rollout rows and m × devices divides M."""
    _check_divisible(rows, "batch rows B", self.mini_batch_size, "mini_batch_size")
    micro = self.micro_batch_size * devices
    _check_divisible(self.mini_batch_size, "mini_batch_size", micro, "micro_batch_size × devices")

  def as_float32(self) -> UpdateSettings:
    """The same settings with float32 array leaves, as the jitted step takes them."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), self)

  def tree_flatten(self):
    static = (self.mini_batch_size, self.micro_batch_size, self.use_sampler_logp)
    return (self.loss,), (*static, self.chunk_size, self.remat)

  @classmethod
  def tree_unflatten(cls, static, leaves):
    out = object.__new__(cls)  # no validation: leaves may be tracers or abstract values here
    names = ("mini_batch_size", "micro_batch_size", "use_sampler_logp", "chunk_size", "remat")
    vars(out).update(zip((*names, "loss"), (*static, *leaves), strict=True))
    return out


def update_step(
  state: GRPOState,
  batch: GRPOBatch,
  ref_params: Params | None,
  settings: UpdateSettings,
  *,
  config: ModelConfig,
  optimizer: optax.GradientTransformation,
  mesh: Mesh | None = None,
  lower: bool = False,
) -> tuple[GRPOState, dict[str, jax.Array]] | jax.stages.Lowered:
  """B / mini_batch_size optimizer steps on one rollout, minimising `es_jax.grpo.loss.grpo_loss`.

  Jitted with `state` donated: do not reuse the state passed in, and keep `ref_params` in buffers
  of their own (`init_state` copies).

  Args:
    state: the rollout policy's state; its params are π_old for the whole step.
    batch: from `rollout` + `with_advantages`, leading axis sharded over `DATA_AXIS` if `mesh`.
    ref_params: frozen reference π_ref for the k3 KL term; not needed (ignored) when beta == 0.
    settings: the loss and batching (`UpdateSettings`).
    config: the model config (static).
    optimizer: e.g. `make_optimizer(...)` (static: the same object reuses the compiled step).
    mesh: the device mesh, its `DATA_AXIS` splitting the batch's rows. Params (and the optimizer
      state) keep the shardings they come with: replicated (`replicate`), or split over another
      mesh axis (e.g. es_jax.devices.sharding.shard_params over 'model'); the mesh needs Auto axes.
    lower: return the lowered program (`jax.stages.Lowered`) instead of running it. Every check
      here reads shapes only, so `state`, `batch` and `ref_params` may be abstract
      (`jax.ShapeDtypeStruct`s with shardings, e.g. `abstract_state`): compile the result for
      any target, a TPU topology included, and read its memory and cost analyses.

  Returns:
    (new state, metrics) with one entry per optimizer step ([B / M] float32 arrays): `loss`,
    `pg_loss`, `kl`, `ratio_mean`, `clip_frac`, `clip_frac_low`, `clip_frac_high`, `entropy`
    (policy entropy on the completion tokens), `grad_norm` (before clipping), `update_ratio`
    (‖Δθ‖₂ / ‖θ‖₂ of the optimizer step), `num_tokens` and,
    for `make_optimizer`, `learning_rate`.
  """
  _check_batch(batch)
  settings.check_rows(np.shape(batch.tokens)[0], 1 if mesh is None else mesh.shape[DATA_AXIS])
  beta_value = _checks.concrete_float(settings.loss.beta)
  if beta_value == 0.0:
    ref_params = None  # No KL term: skip the reference forward pass entirely.
  elif ref_params is None:
    raise ValueError(
      f"beta={settings.loss.beta} > 0 needs ref_params (the frozen reference policy)."
    )
  program = _update_step.lower if lower else _update_step
  return program(
    state,
    batch,
    ref_params,
    settings.as_float32(),
    config=config,
    optimizer=optimizer,
    mesh=mesh,
    state_shardings=None if mesh is None else state_shardings(state),
  )


def state_shardings(state: GRPOState) -> tuple[Any, ...]:
  """The state's leaves' shardings, canonical: the step returns the state laid out exactly as it
  came in (say params split over a 'model' axis), so donation reuses the buffers and the next
  call does not recompile."""
  return tuple(map(canonical_sharding, jax.tree.leaves(state)))


def _check_batch(batch: GRPOBatch) -> None:
  """Raises ValueError unless the batch's arrays have the shapes its tokens [B, S] imply."""
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


class _Layout(NamedTuple):
  """How the B rows split into [num_mini, n, m] micro-batches, and where they live."""

  num_mini: int
  num_micro: int  # n
  micro_rows: int  # m: one accumulation step over all devices
  mini_batch_size: int
  mesh: Mesh | None

  def constrain(self, x, lead):  # keeps the row axis (after `lead` unsharded axes) on DATA_AXIS
    if self.mesh is None:
      return x
    spec = PartitionSpec(*([None] * lead), DATA_AXIS)
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

  def to_micro(
    self, x
  ):  # [B, ...] -> [num_mini, n, m, ...]; row i + num_mini (l·n + j) -> [i, j, l]
    num_mini, num_micro, micro_rows = self.num_mini, self.num_micro, self.micro_rows
    x = x.reshape(self.mini_batch_size, num_mini, *x.shape[1:]).swapaxes(0, 1)  # [num_mini, M, ...]
    x = x.reshape(num_mini, micro_rows, num_micro, *x.shape[2:]).swapaxes(1, 2)
    return self.constrain(x, 2)


_TOKEN_METRICS = ("kl", "ratio_mean", "clip_frac", "clip_frac_low", "clip_frac_high", "entropy")


@functools.partial(
  jax.jit,
  # Static: the model and optimizer structure and the layout (`settings` keeps its own static
  # fields); the state's shardings, so the new state is laid out as the old one.
  static_argnames=("config", "optimizer", "mesh", "state_shardings"),
  donate_argnames=("state",),
)
def _update_step(state, batch, ref_params, settings, *, config, optimizer, mesh, state_shardings):
  mini = settings.mini_batch_size
  devices = 1 if mesh is None else mesh.shape[DATA_AXIS]
  micro_rows = settings.micro_batch_size * devices
  num_mini = batch.tokens.shape[0] // mini
  layout = _Layout(num_mini, mini // micro_rows, micro_rows, mini, mesh)
  T = batch.completion_length
  score = functools.partial(completion_logprobs, config=config, completion_length=T)
  score = functools.partial(score, chunk_size=settings.chunk_size)
  data = _micro_batches(state.params, batch, ref_params, settings, layout, score, config.jnp_dtype)
  train_score = functools.partial(score, remat=settings.remat)  # frozen passes need no backward
  micro_loss = functools.partial(_micro_loss, score=train_score, settings=settings, length=T)
  mini_step = functools.partial(
    _mini_step,
    grad_fn=jax.value_and_grad(micro_loss, has_aux=True),
    optimizer=optimizer,
    compute_dtype=config.jnp_dtype,
    layout=layout,
  )
  (params, opt_state), metrics = jax.lax.scan(mini_step, (state.params, state.opt_state), data)
  new_state = GRPOState(params=params, opt_state=opt_state, step=state.step + num_mini)
  if state_shardings is not None:
    shardings = jax.tree.unflatten(jax.tree.structure(state), state_shardings)
    new_state = jax.lax.with_sharding_constraint(new_state, shardings)
  return new_state, metrics


def _micro_batches(params, batch, ref_params, settings, layout, score, compute_dtype):
  """The rollout as [num_mini, n, m, ...] arrays: tokens, masks, advantages, π_old's and π_ref's
  log-probs where needed, and each micro-batch's weight in its mini-batch's loss."""
  T = batch.completion_length
  data = {
    "tokens": batch.tokens,
    "mask": batch.mask,
    "loss_mask": batch.loss_mask[:, -T:],  # [B, T]: the completion window
    "advantages": batch.advantages,
  }
  data = jax.tree.map(layout.to_micro, data)
  frozen_logp = functools.partial(
    _frozen_logp, data=data, score=score, compute_dtype=compute_dtype, layout=layout
  )
  if settings.use_sampler_logp:
    data["old_logp"] = layout.to_micro(batch.sampler_logp[:, -T:])
  elif layout.num_mini > 1:
    data["old_logp"] = frozen_logp(params)
  # else: one mini-batch is trained at the rollout params, so π_old = stop_gradient(π_θ) exactly
  # and its forward pass is skipped.
  if ref_params is not None:
    data["ref_logp"] = frozen_logp(ref_params)

  # Normalisers of the mini-batch loss, so each micro-batch's loss is weighted to sum to it.
  tokens_per_micro = jnp.sum(data["loss_mask"], axis=-1, dtype=jnp.float32)  # [num_mini, n, m]
  if settings.loss.aggregation == "token_mean":
    count = jnp.sum(tokens_per_micro, axis=-1)  # [num_mini, n]
  else:
    count = jnp.full((layout.num_mini, layout.num_micro), float(layout.micro_rows))
  data["weight"] = count / jnp.maximum(jnp.sum(count, axis=1, keepdims=True), 1.0)
  return data


def _frozen_logp(params, *, data, score, compute_dtype, layout):
  """[num_mini, n, m, T] log-probs under fixed params, one micro-batch at a time."""
  params = cast_params(params, compute_dtype)  # once, not per micro-batch
  flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), data)
  logp = jax.lax.map(lambda d: score(params, d["tokens"], d["mask"])[0], flat)
  return jax.lax.stop_gradient(logp.reshape(layout.num_mini, layout.num_micro, *logp.shape[1:]))


def _micro_loss(params, d, *, score, settings, length):
  """One micro-batch's loss, weighted to its share of the mini-batch's, and its metrics."""
  logp, entropy = score(params, d["tokens"], d["mask"])  # [m, T]
  # Without a reference, beta is the Python float 0.0 grpo_loss needs to drop the KL term.
  loss_settings = settings.loss if "ref_logp" in d else dataclasses.replace(settings.loss, beta=0.0)
  loss, metrics = grpo_loss(
    logp,
    d.get("old_logp", jax.lax.stop_gradient(logp)),
    d.get("ref_logp"),
    d["advantages"],
    d["loss_mask"],
    loss_settings,
    entropy=entropy,
    max_length=length,
  )
  return loss * d["weight"], metrics


def _mini_step(carry, mini, *, grad_fn, optimizer, compute_dtype, layout):
  """One optimizer step on one mini-batch, its gradient accumulated over micro-batches."""
  params, opt_state = carry
  # Forward and backward in the compute dtype. The gradient with respect to float32 masters
  # through a cast is this one upcast (the cast's transpose), so nothing is lost by taking it
  # with respect to the cast copy, made once per mini-batch instead of once per micro-batch.
  params_c = cast_params(params, compute_dtype)

  def accumulate(acc, d):
    d = {k: layout.constrain(v, 0) if v.ndim > 0 else v for k, v in d.items()}
    (loss, m), grads = grad_fn(params_c, d)
    grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    n = m["num_tokens"]
    sums = {k: m[k] * n for k in _TOKEN_METRICS}
    sums.update(loss=loss, pg_loss=m["pg_loss"] * d["weight"], num_tokens=n)
    return jax.tree.map(jnp.add, acc, (grads, sums)), None

  zero_sums = {k: jnp.zeros((), jnp.float32) for k in (*_TOKEN_METRICS, "loss", "pg_loss")}
  zero_sums["num_tokens"] = jnp.zeros((), jnp.float32)
  # float32 accumulators: summing many bfloat16 micro-batch gradients would lose precision.
  zeros = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), zero_sums)
  (grads, sums), _ = jax.lax.scan(accumulate, zeros, mini)
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  # ‖Δθ‖/‖θ‖ of this optimizer step (an overflowing update gives inf): the runners stop a run
  # whose updates dwarf the weights.
  update_ratio = optax.tree.norm(updates) / jnp.maximum(optax.tree.norm(params), 1e-30)
  # Float32 gradients would promote low-precision moments (master_dtype=None on a bf16 model);
  # the scan carry must keep its dtypes. A no-op for float32 masters.
  opt_state = jax.tree.map(lambda new, old: new.astype(old.dtype), new_opt_state, opt_state)
  params = optax.apply_updates(params, updates)  # rounds once to the masters' dtype
  metrics = {k: sums[k] / jnp.maximum(sums["num_tokens"], 1.0) for k in _TOKEN_METRICS}
  metrics.update(
    loss=sums["loss"],
    pg_loss=sums["pg_loss"],
    num_tokens=sums["num_tokens"],
    grad_norm=optax.tree.norm(grads),
    update_ratio=update_ratio,
  )
  hyperparams = getattr(opt_state, "hyperparams", {})
  if "learning_rate" in hyperparams:
    metrics["learning_rate"] = jnp.asarray(hyperparams["learning_rate"], jnp.float32)
  return (params, opt_state), metrics
