"""GRPO rollouts: G completions per prompt, laid out as one batch for `grpo_update.update_step`.

Axis letters as in es_jax.grpo.loss: P prompts, G generations per prompt, B = P·G sequences,
Sp prompt tokens, S = Sp + T prompt + completion tokens, T completion tokens, V vocabulary.
Row b = p·G + g of every array is generation g of prompt p, so rewards.reshape(P, G) are groups.
On a mesh the rows are split over its `DATA_AXIS`, 'pop' (es_jax.devices.sharding's layout: the
axis ES splits its population over).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax import _checks
from es_jax.decode.sampling import Completions, Decoding, generate
from es_jax.grpo.loss import group_advantages, token_logprobs_from_logits
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import (
  ForwardMode,
  Params,
  cast_params,
  forward,
  positions_from_mask,
)

DATA_AXIS = "pop"  # the mesh axis the B rows are split over


@struct.dataclass
class GRPOBatch:
  """One rollout, ready for `update_step`. Row b = p·G + g is generation g of prompt p.

  Per-token fields follow `es_jax.grpo.loss.token_logprobs`' shift convention: index t refers to
  tokens[:, t+1], so a completion token at position s of `tokens` sits at index s − 1.
  """

  tokens: jax.Array  # [B, S] int32: left-padded prompt, then the completion.
  mask: jax.Array  # [B, S] bool: real tokens (prompt and generated, EOS included).
  loss_mask: jax.Array  # [B, S-1] bool: completion tokens only.
  sampler_logp: jax.Array  # [B, S-1] float32: the sampler's untempered log-probs, 0 elsewhere.
  advantages: jax.Array  # [B] float32: zeros until `with_advantages`.
  # Static (part of the type, not traced): the completion is tokens[:, -completion_length:],
  # which lets the update score only the completion window.
  completion_length: int = struct.field(pytree_node=False)


def _check_divisible(n: int, n_name: str, d: int, d_name: str) -> None:
  if n % d:
    raise ValueError(f"{n_name}={n} is not divisible by {d_name}={d}.")


def rollout(
  params: Params,
  prompt_ids: jax.Array,
  prompt_mask: jax.Array,
  *,
  config: ModelConfig,
  key: jax.Array,
  num_generations: int,
  decoding: Decoding,
  mesh: Mesh | None = None,
) -> tuple[Completions, GRPOBatch]:
  """Samples G completions per prompt and lays them out for `update_step`.

  Args:
    params: the policy's parameters (the rollout policy π_old); float32 master weights of a
      lower-precision model are cast to `config.dtype` once, before the decode loop.
    prompt_ids: [P, Sp] left-padded prompts (see `es_jax.decode.sampling.pad_prompts`).
    prompt_mask: [P, Sp] bool.
    config: the model config (static).
    key: sampling key.
    num_generations: G >= 2; each prompt is repeated G times (rows p·G .. p·G + G − 1).
    decoding: the completion budget T, temperature (paper: 1.0), top-p, stop and pad tokens
      (`es_jax.decode.sampling.Decoding`).
    mesh: if given, the B = P·G rows are sharded over its `DATA_AXIS` before sampling.

  Returns:
    (completions [B, T], batch) with batch.advantages zero; set them with `with_advantages`.
  """
  if _checks.positive_int(num_generations, "num_generations") < 2:
    raise ValueError(
      f"num_generations={num_generations}: GRPO compares completions within a group, so G >= 2."
    )
  prompt_ids, prompt_mask = jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(prompt_mask, bool)
  if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape or not prompt_ids.shape[1]:
    raise ValueError(
      f"prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must be equal [P, Sp] "
      "with Sp >= 1."
    )
  ids = jnp.repeat(prompt_ids, num_generations, axis=0)  # [B, Sp]
  ids_mask = jnp.repeat(prompt_mask, num_generations, axis=0)  # [B, Sp]
  if mesh is not None:
    _check_divisible(ids.shape[0], "rows P·G", mesh.shape[DATA_AXIS], f"devices on '{DATA_AXIS}'")
    rows = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    ids, ids_mask = jax.device_put(ids, rows), jax.device_put(ids_mask, rows)
  completions = generate(
    cast_params(params, config.jnp_dtype),  # float32 masters sample in the compute dtype
    ids,
    ids_mask,
    decoding.replace(prefill_rows=prompt_ids.shape[0]),  # each prompt prefilled once, not G times
    key=key,
    config=config,
  )
  return completions, _layout(ids, ids_mask, completions)


@jax.jit
def _layout(ids, ids_mask, completions: Completions) -> GRPOBatch:
  batch, prompt_length = ids.shape
  before = jnp.zeros((batch, prompt_length - 1))  # shifted prompt positions: never in the loss
  return GRPOBatch(
    tokens=jnp.concatenate([ids, completions.tokens], axis=1),
    mask=jnp.concatenate([ids_mask, completions.mask], axis=1),
    loss_mask=jnp.concatenate([before.astype(bool), completions.mask], axis=1),
    sampler_logp=jnp.concatenate([before, completions.logprobs], axis=1),
    advantages=jnp.zeros((batch,), jnp.float32),
    completion_length=completions.tokens.shape[1],
  )


def with_advantages(
  batch: GRPOBatch, rewards: Any, *, std: str | None = "population", eps: float = 1e-4
) -> tuple[GRPOBatch, dict[str, jax.Array]]:
  """Sets batch.advantages from rewards [P, G] (`es_jax.grpo.loss.group_advantages`); returns its
  stats. Rewards are maximised."""
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 2 or rewards.size != batch.advantages.shape[0]:
    raise ValueError(
      f"rewards shape {rewards.shape} must be [P, G] with P·G = {batch.advantages.shape[0]} rows "
      "of the batch (row p·G + g is generation g of prompt p)."
    )
  advantages, stats = group_advantages(rewards, std=std, eps=eps)
  advantages = advantages.reshape(-1)
  return batch.replace(advantages=jax.device_put(advantages, batch.advantages.sharding)), stats


def completion_logprobs(
  params: Params,
  tokens: jax.Array,
  mask: jax.Array,
  *,
  config: ModelConfig,
  completion_length: int,
  chunk_size: int | None = None,
  remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """log π(tokens[:, s] | tokens[:, :s]) and the entropy before it, for the last T positions.

  Equals `es_jax.grpo.loss.token_logprobs(...)[:, -T:]` on completion tokens; only the completion's
  [B, T, V] logits are turned into log-probabilities. Returns (logp, entropy), each [B, T] f32.
  `remat` recomputes each layer in the backward pass (see `es_jax.models.ForwardMode`).
  """
  positions = positions_from_mask(mask)
  # Only the last T + 1 positions go through the lm head ([B, T + 1, V], not [B, S, V]); the
  # last one predicts past the sequence and is dropped.
  logits, _ = forward(
    params,
    tokens,
    positions,
    config=config,
    mask=mask,
    mode=ForwardMode(last_only=completion_length + 1, remat=remat),
  )
  logits = logits[:, :-1]  # [B, T, V]: row j predicts token S − T + j
  return token_logprobs_from_logits(logits, tokens[:, -completion_length:], chunk_size=chunk_size)


def shard_batch(batch: GRPOBatch, mesh: Mesh) -> GRPOBatch:
  """Places the batch's rows on `DATA_AXIS` of `mesh` (contiguous blocks of rows per device)."""
  return jax.device_put(batch, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))


@jax.jit
def rollout_stats(completions: Completions) -> dict[str, jax.Array]:
  """Token entropy of the rollouts (the paper's entropy-collapse signal) and response lengths.

  `frac_full_length` counts responses that used the whole budget (truncated unless their last
  token is an EOS)."""
  mask = completions.mask.astype(jnp.float32)  # [B, T]
  total = jnp.maximum(jnp.sum(mask), 1.0)
  lengths = completions.lengths.astype(jnp.float32)
  return {
    "rollout_entropy": jnp.sum(completions.entropy * mask) / total,
    "rollout_logp": jnp.sum(completions.logprobs * mask) / total,
    "response_length": jnp.mean(lengths),
    "frac_full_length": jnp.mean((lengths >= completions.tokens.shape[1]).astype(jnp.float32)),
  }
