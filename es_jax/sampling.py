"""Batched autoregressive sampling with a KV cache (greedy, temperature, top-p).

One compile per (batch, prompt length, max_new_tokens, eos set, top-p on/off): temperature and
top-p values are traced, so sweeping them does not recompile; `pad_prompts` buckets prompt
lengths so new batches reuse compiled code. `generate` works under `jax.vmap` over a leading
params (or low-rank delta) axis, which is how ES evaluates many perturbed models at once, and
with the prompt batch sharded over devices (jit follows the input sharding).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es_jax.models.config import ModelConfig
from es_jax.models.transformer import Params, Transformer, forward, init_cache
from es_jax.models.transformer import params as model_params


class Completions(NamedTuple):
  """Generated continuations. Positions after a row's EOS are masked and hold `pad_id`."""

  tokens: jax.Array  # [B, T] int32
  logprobs: jax.Array  # [B, T] float32: log π(token) under the untempered model distribution.
  entropy: jax.Array  # [B, T] float32: full-distribution entropy of the untempered model.
  mask: jax.Array  # [B, T] bool: generated token (the EOS token included).
  lengths: jax.Array  # [B] int32: number of generated tokens, EOS included.


def pad_prompts(
  prompts: Sequence[Sequence[int]], *, pad_id: int, bucket: int = 32, min_length: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to a common length rounded up to a multiple of `bucket`.

  Returns (ids [B, S] int32, mask [B, S] bool). Rounding keeps the number of distinct prompt
  shapes (hence compiles) small.
  """
  if not prompts:
    raise ValueError("pad_prompts: got no prompts.")
  longest = max(max(len(p) for p in prompts), min_length, 1)
  length = -(-longest // bucket) * bucket
  ids = np.full((len(prompts), length), pad_id, np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for i, p in enumerate(prompts):
    if len(p):
      ids[i, length - len(p) :] = p
      mask[i, length - len(p) :] = True
  return ids, mask


def encode_prompts(tokenizer, texts: Sequence[str], *, bucket: int = 32):
  """Tokenises already-formatted prompt strings and left-pads them (see `pad_prompts`)."""
  ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return pad_prompts(ids, pad_id=pad_id, bucket=bucket)


def sample_token(logits, key, temperature, top_p, *, use_top_p: bool):
  """Draws one token per row. logits [B, V] float32 -> [B] int32.

  Greedy where temperature == 0. Otherwise an exact inverse-CDF draw with one uniform per row
  (much cheaper than `jax.random.categorical`'s Gumbel noise over a large vocabulary). With
  top-p, the smallest set of most likely tokens whose mass reaches `top_p` is kept.
  """
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  scaled = logits / jnp.maximum(temperature, 1e-6)
  u = jax.random.uniform(key, logits.shape[:-1])
  if use_top_p:
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    probs = jnp.where(mass_before < top_p, probs, 0.0)  # keeps at least the top token
    cdf = jnp.cumsum(probs, axis=-1)
    idx = jnp.sum(cdf < u[..., None] * cdf[..., -1:], axis=-1)
    idx = jnp.minimum(idx, logits.shape[-1] - 1)
    # Guard against rounding landing on a zero-probability tail token.
    idx = jnp.where(jnp.take_along_axis(probs, idx[..., None], -1)[..., 0] > 0, idx, 0)
    sampled = jnp.take_along_axis(order, idx[..., None], axis=-1)[..., 0]
  else:
    probs = jax.nn.softmax(scaled, axis=-1)
    cdf = jnp.cumsum(probs, axis=-1)
    sampled = jnp.sum(cdf < u[..., None] * cdf[..., -1:], axis=-1)
    sampled = jnp.minimum(sampled, logits.shape[-1] - 1)
    sampled = jnp.where(
      jnp.take_along_axis(probs, sampled[..., None], -1)[..., 0] > 0, sampled, greedy
    )
  return jnp.where(temperature > 0, sampled.astype(jnp.int32), greedy)


@functools.partial(
  jax.jit,
  # Static: shapes and the model structure decide the compiled program.
  static_argnames=("config", "max_new_tokens", "eos_ids", "use_top_p", "pad_id"),
)
def _generate(
  params,
  deltas,
  delta_scale,
  prompt_ids,
  prompt_mask,
  key,
  temperature,
  top_p,
  *,
  config: ModelConfig,
  max_new_tokens: int,
  eos_ids: tuple[int, ...],
  use_top_p: bool,
  pad_id: int,
):
  B, S = prompt_ids.shape
  cache = init_cache(config, B, S + max_new_tokens)
  positions = jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)
  logits, cache = forward(
    params,
    prompt_ids,
    positions,
    config=config,
    mask=prompt_mask,
    cache=cache,
    cache_index=0,
    deltas=deltas,
    delta_scale=delta_scale,
    last_only=True,
  )
  prompt_len = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)  # [B]
  eos = jnp.asarray(eos_ids or (-1,), jnp.int32)

  out = Completions(
    tokens=jnp.full((B, max_new_tokens), pad_id, jnp.int32),
    logprobs=jnp.zeros((B, max_new_tokens), jnp.float32),
    entropy=jnp.zeros((B, max_new_tokens), jnp.float32),
    mask=jnp.zeros((B, max_new_tokens), bool),
    lengths=jnp.zeros((B,), jnp.int32),
  )

  def cond(state):
    t, _, _, done, _ = state
    return (t < max_new_tokens) & ~jnp.all(done)

  def body(state):
    t, cache, logits, done, out = state
    logits = logits[:, -1]  # [B, V]
    tok = sample_token(logits, jax.random.fold_in(key, t), temperature, top_p, use_top_p=use_top_p)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, tok[:, None], axis=-1)[:, 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    live = ~done
    tok = jnp.where(live, tok, pad_id)
    out = Completions(
      tokens=out.tokens.at[:, t].set(tok),
      logprobs=out.logprobs.at[:, t].set(jnp.where(live, logp, 0.0)),
      entropy=out.entropy.at[:, t].set(jnp.where(live, ent, 0.0)),
      mask=out.mask.at[:, t].set(live),
      lengths=out.lengths + live.astype(jnp.int32),
    )
    done = done | jnp.isin(tok, eos)
    logits, cache = forward(
      params,
      tok[:, None],
      (prompt_len + t)[:, None],
      config=config,
      mask=live[:, None],
      cache=cache,
      cache_index=S + t,
      deltas=deltas,
      delta_scale=delta_scale,
    )
    return t + 1, cache, logits, done, out

  state = (jnp.int32(0), cache, logits, jnp.zeros((B,), bool), out)
  *_, out = jax.lax.while_loop(cond, body, state)
  return out


def generate(
  params_or_model: Params | Transformer,
  prompt_ids,
  prompt_mask,
  *,
  key: jax.Array,
  max_new_tokens: int,
  temperature: float | jax.Array = 0.0,
  top_p: float | jax.Array | None = None,
  eos_ids: Sequence[int] = (),
  pad_id: int = 0,
  config: ModelConfig | None = None,
  deltas: Params | None = None,
  delta_scale: float | jax.Array | None = None,
) -> Completions:
  """Samples continuations of left-padded prompts.

  Args:
    params_or_model: a `Transformer`, or its parameter dict (then `config` is required).
    prompt_ids: [B, S] int, left-padded (see `pad_prompts`).
    prompt_mask: [B, S] bool, False on padding.
    key: PRNG key; row draws at step t use fold_in(key, t).
    max_new_tokens: decode budget (static).
    temperature: 0 for greedy; traced, so changing it does not recompile.
    top_p: nucleus mass; None or >= 1 disables it (static switch, traced value).
    eos_ids: tokens that end a row; the EOS token is kept (masked in) and counted in lengths.
    pad_id: filler after a row ends.
    config: model config when passing a params dict.
    deltas, delta_scale: low-rank perturbations for the model (see es_jax.models.forward).

  Returns:
    Completions with tokens, logprobs, entropy, mask [B, max_new_tokens] and lengths [B].
  """
  if isinstance(params_or_model, Transformer):
    config = params_or_model.config
    params_or_model = model_params(params_or_model)
  if config is None:
    raise ValueError("generate: pass `config=` when giving a params dict instead of a model.")
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}.")
  prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
  prompt_mask = jnp.asarray(prompt_mask, bool)
  if prompt_ids.shape != prompt_mask.shape or prompt_ids.ndim != 2:
    raise ValueError(
      f"generate: prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must be "
      "equal [batch, length] shapes."
    )
  use_top_p = top_p is not None and not (isinstance(top_p, (int, float)) and top_p >= 1.0)
  return _generate(
    params_or_model,
    deltas,
    delta_scale,
    prompt_ids,
    prompt_mask,
    key,
    jnp.asarray(temperature, jnp.float32),
    jnp.asarray(1.0 if top_p is None else top_p, jnp.float32),
    config=config,
    max_new_tokens=int(max_new_tokens),
    eos_ids=tuple(int(e) for e in eos_ids),
    use_top_p=use_top_p,
    pad_id=int(pad_id),
  )
