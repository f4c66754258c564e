"""One decoder layer of `es_jax.models.transformer.forward` and the loops over the layers.

The ops (RMSNorm, RoPE, the linear map with its low-rank hook) and the three ways `forward` runs
its layers: unrolled over per-layer weights and cache buffers (the CPU decode path), scanned
without a cache (training, with optional remat), and scanned with the stacked cache in the carry.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from es_jax.models.attention import (
  KVCache,
  bucketed_cached_attention,
  cached_attention,
  self_attention,
  write_slots,
)
from es_jax.models.config import ModelConfig


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm in float32, cast back before the weight multiply (as HF Llama/Qwen2 do)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight * y.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
  """Inverse frequencies [E/2], with Llama-3 scaling when configured."""
  dim = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  s = config.rope_scaling
  if s is None:
    return inv_freq
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
    s.high_freq_factor - s.low_freq_factor
  )
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotate-half RoPE (HF layout). x [B, S, heads, E], positions [B, S]."""
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, E/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, S, 1, E]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def low_rank(x, a, b):
  """(x @ a) @ b.T for x [..., m], a [m, R], b [n, R]."""
  return (x @ a.astype(x.dtype)) @ b.T.astype(x.dtype)


def linear(x, w, delta=None, scale=None):
  y = x @ w
  if delta is not None:
    a, b = delta  # [m, R], [n, R]
    y = y + (scale * low_rank(x, a, b)).astype(y.dtype)
  return y


class Block(NamedTuple):
  """What every layer of one `forward` call shares (see its arguments)."""

  config: ModelConfig
  positions: jax.Array  # [B, S]
  inv_freq: jax.Array  # [E/2]
  allowed: jax.Array  # [B, S, T] bool
  cached: bool  # a KV cache is given
  kv_mask: jax.Array  # [B, T] bool
  cache_index: Any
  kv_chunk: int | None
  delta_scale: Any


def decoder_layer(blk: Block, h, p, d, write):
  """One decoder layer. `write(k, v)` takes this block's keys and values ([B,S,K,E]) and
  returns (keys, values to attend over, updated cache state)."""
  c, delta_scale = blk.config, blk.delta_scale
  B, S = h.shape[:2]
  x = rms_norm(h, p["attn_norm"], c.norm_eps)
  q = linear(x, p["wq"], d.get("wq"), delta_scale)
  k = linear(x, p["wk"], d.get("wk"), delta_scale)
  v = linear(x, p["wv"], d.get("wv"), delta_scale)
  if c.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  q = apply_rope(q.reshape(B, S, c.num_heads, c.head_dim), blk.positions, blk.inv_freq)
  k = apply_rope(k.reshape(B, S, c.num_kv_heads, c.head_dim), blk.positions, blk.inv_freq)
  v = v.reshape(B, S, c.num_kv_heads, c.head_dim)
  keys, values, state = write(k, v)
  if not blk.cached:
    attn = self_attention(q, keys, values, blk.allowed)
  elif blk.kv_chunk is None:
    attn = cached_attention(q, keys, values, blk.allowed)
  else:
    attn = bucketed_cached_attention(
      q, keys, values, blk.allowed, blk.cache_index, chunk=blk.kv_chunk
    )
  h = h + linear(attn, p["wo"], d.get("wo"), delta_scale)
  x = rms_norm(h, p["mlp_norm"], c.norm_eps)
  gate = linear(x, p["w_gate"], d.get("w_gate"), delta_scale)
  up = linear(x, p["w_up"], d.get("w_up"), delta_scale)
  h = h + linear(jax.nn.silu(gate) * up, p["w_down"], d.get("w_down"), delta_scale)
  return h, state


def _no_cache(k, v):
  return k, v, None


def run_unrolled(blk: Block, h, layers, layer_deltas, cache: KVCache | None):
  """Per-layer weights and cache buffers: the matmuls read the weights in place and the cache
  writes are in place, so a decode step copies neither. Returns (h, updated cache or None)."""
  if cache is not None and not isinstance(cache.k, tuple):
    raise ValueError("forward: unstacked layers need an unstacked cache (`unstack_cache`).")

  def write_layer(i, k, v):
    k_i, v_i = write_slots(cache.k[i], cache.v[i], k, v, blk.cache_index)
    return k_i, v_i, (k_i, v_i)

  new_k, new_v = [], []
  for i, (p, d) in enumerate(zip(layers, layer_deltas, strict=True)):
    write = _no_cache if cache is None else functools.partial(write_layer, i)
    h, state = decoder_layer(blk, h, p, d, write)
    if state is not None:
      new_k.append(state[0])
      new_v.append(state[1])
  if cache is None:
    return h, None
  return h, KVCache(k=tuple(new_k), v=tuple(new_v), mask=blk.kv_mask)


def run_scanned(blk: Block, h, layers, layer_deltas, remat: bool):
  """The stacked layers under `jax.lax.scan`, no cache.

  For a backward pass each layer saves only its matrix products (q, k, v, the attention
  scores and output, the MLP's gate, up and down) and recomputes the elementwise ops between
  them (norms, RoPE, softmax, SiLU): the SmolLM2-135M GRPO update of 16 rows of 112 tokens
  plans 2,798 MiB of temporaries instead of 4,758 MiB (XLA:CPU memory analysis, see
  docs/benchmarks.md). `remat` saves nothing (each layer is recomputed whole). A forward pass
  alone runs the same ops either way.
  """
  body = lambda h, xs: (decoder_layer(blk, h, *xs, _no_cache)[0], None)  # noqa: E731
  # prevent_cse=False: under scan CSE cannot undo the rematerialisation.
  policy = None if remat else jax.checkpoint_policies.checkpoint_dots
  body = jax.checkpoint(body, prevent_cse=False, policy=policy)
  h, _ = jax.lax.scan(body, h, (layers, layer_deltas))
  return h


def run_scanned_cached(blk: Block, h, layers, layer_deltas, cache: KVCache):
  """The stacked cache rides in the scan carry: the block is written in place and only the
  running layer's slots are sliced out to attend over. Returns (h, updated cache)."""
  if isinstance(cache.k, tuple):
    raise ValueError("forward: stacked layers need a stacked cache (`init_cache`).")

  def scan_layer(carry, xs):
    h, k_all, v_all = carry
    p, d, i = xs

    def write(k, v):
      k_new, v_new = write_slots(k_all, v_all, k, v, blk.cache_index, lead=(i,))
      return k_new[i], v_new[i], (k_new, v_new)

    h, (k_all, v_all) = decoder_layer(blk, h, p, d, write)
    return (h, k_all, v_all), None

  xs = (layers, layer_deltas, jnp.arange(blk.config.num_layers))
  (h, k_all, v_all), _ = jax.lax.scan(scan_layer, (h, cache.k, cache.v), xs)
  return h, KVCache(k=k_all, v=v_all, mask=blk.kv_mask)
