"""Llama / Qwen2-family decoder: a flax.nnx module over a pure functional forward pass.

Axis letters used in shape comments throughout es_jax:
  B batch, S query length, T key length (KV-cache slots), L layers, D hidden size,
  H query heads, K key/value heads, G query heads per KV head (H = K * G), E head dim,
  F MLP hidden size, V vocabulary, R low-rank noise rank, N population members.

Parameters are a plain nested dict (`params(model)`), with every per-layer tensor stacked on a
leading L axis and the layer loop run by `jax.lax.scan`, so compile time does not grow with
depth. Matrices are stored input-major (`y = x @ w`, shape [in, out]), the transpose of the HF
layout; the loaders transpose. The embedding is [V, D] in both.

The low-rank hook: `forward(..., deltas=..., delta_scale=c)` adds c * a @ b.T to any matrix W
([..., m, n], a [..., m, R], b [..., n, R]) without materialising it:
x @ (W + c a bᵀ) = x @ W + c (x @ a) @ bᵀ. `deltas` mirrors the params dict and holds (a, b)
pairs only for the matrices that are perturbed; EGGROLL-style ES (PAPER.md §2) passes
c = sigma / sqrt(R).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from es_jax.models.config import ModelConfig

Params = dict[str, Any]

LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


class KVCache(NamedTuple):
  """Functional KV cache. Slots are shared by the batch; left padding keeps rows aligned."""

  k: jax.Array  # [L, B, T, K, E]
  v: jax.Array  # [L, B, T, K, E]
  mask: jax.Array  # [B, T] bool: slot holds a real (non-pad) token.


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
  dtype = dtype or config.jnp_dtype
  shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
  return KVCache(
    k=jnp.zeros(shape, dtype),
    v=jnp.zeros(shape, dtype),
    mask=jnp.zeros((batch_size, max_len), bool),
  )


def param_shapes(config: ModelConfig) -> Params:
  """Shapes of every parameter, as a nested dict matching `params(model)`."""
  c = config
  L, D, F = c.num_layers, c.hidden_size, c.intermediate_size
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  layers = {
    "attn_norm": (L, D),
    "wq": (L, D, q),
    "wk": (L, D, kv),
    "wv": (L, D, kv),
    "wo": (L, q, D),
    "mlp_norm": (L, D),
    "w_gate": (L, D, F),
    "w_up": (L, D, F),
    "w_down": (L, F, D),
  }
  if c.qkv_bias:
    layers.update(bq=(L, q), bk=(L, kv), bv=(L, kv))
  shapes = {"embed": (c.vocab_size, D), "layers": layers, "final_norm": (D,)}
  if not c.tie_embeddings:
    shapes["lm_head"] = (D, c.vocab_size)
  return shapes


# ----------------------------------------------------------------------------- building blocks


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


def _linear(x, w, delta=None, scale=None):
  y = x @ w
  if delta is not None:
    a, b = delta  # [m, R], [n, R]
    y = y + (scale * ((x @ a.astype(x.dtype)) @ b.T.astype(x.dtype))).astype(y.dtype)
  return y


def _embed(params: Params, tokens: jax.Array, deltas: Params, scale) -> jax.Array:
  h = jnp.take(params["embed"], tokens, axis=0)  # [B, S, D]
  if deltas.get("embed") is not None:
    a, b = deltas["embed"]  # [V, R], [D, R]
    h = h + (scale * (jnp.take(a, tokens, axis=0) @ b.T)).astype(h.dtype)
  return h


def _unembed(params: Params, h: jax.Array, deltas: Params, scale) -> jax.Array:
  if "lm_head" in params:
    return _linear(h, params["lm_head"], deltas.get("lm_head"), scale)
  logits = h @ params["embed"].T
  if deltas.get("embed") is not None:
    a, b = deltas["embed"]  # tied head: h @ (W + c a bᵀ)ᵀ = h Wᵀ + c (h b) aᵀ
    logits = logits + (scale * ((h @ b.astype(h.dtype)) @ a.T.astype(h.dtype))).astype(h.dtype)
  return logits


def _attention(q, k, v, q_slots, kv_slots, kv_mask):
  """Grouped-query attention. q [B,S,H,E]; k, v [B,T,K,E]; slots index cache positions."""
  B, S, H, E = q.shape
  K = k.shape[2]
  qg = q.reshape(B, S, K, H // K, E)
  scores = jnp.einsum("bskge,btke->bkgst", qg, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(E))
  allowed = kv_mask[:, None, :] & (kv_slots[None, None, :] <= q_slots[None, :, None])  # [B,S,T]
  scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgst,btke->bskge", probs, v)
  return out.reshape(B, S, H * E)


# ----------------------------------------------------------------------------- forward


def forward(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  *,
  config: ModelConfig,
  mask: jax.Array | None = None,
  cache: KVCache | None = None,
  cache_index: jax.Array | int = 0,
  deltas: Params | None = None,
  delta_scale: jax.Array | float | None = None,
  last_only: bool = False,
) -> tuple[jax.Array, KVCache | None]:
  """Runs the decoder on a block of tokens.

  Args:
    params: nested parameter dict (see `param_shapes`).
    tokens: [B, S] int token ids.
    positions: [B, S] RoPE positions (for left-padded rows: cumsum(mask) - 1).
    config: the model's config (static).
    mask: [B, S] bool, False on padding. Defaults to all True.
    cache: if given, this block is written to slots [cache_index, cache_index + S) and
      attends to every valid earlier slot; the updated cache is returned.
    cache_index: first cache slot of this block (traced scalar).
    deltas: optional low-rank perturbations, a dict mirroring `params` with (a, b) pairs on
      matrices (layer matrices carry a leading L axis). See the module docstring.
    delta_scale: c in W + c a bᵀ.
    last_only: return logits of the last position only ([B, 1, V]), for prefill.

  Returns:
    (logits [B, S, V] float32, updated cache or None).
  """
  c = config
  B, S = tokens.shape
  deltas = deltas or {}
  layer_deltas = {k: v for k, v in deltas.get("layers", {}).items() if v is not None}
  if mask is None:
    mask = jnp.ones((B, S), bool)
  inv_freq = rope_inv_freq(c)
  h = _embed(params, tokens, deltas, delta_scale).astype(c.jnp_dtype)
  q_slots = cache_index + jnp.arange(S)
  if cache is not None:
    # Attend to [earlier cache slots, this block]. Unwritten slots are masked by cache.mask.
    kv_mask = jnp.concatenate([cache.mask, mask], axis=1)  # [B, T + S]
    kv_slots = jnp.concatenate([jnp.arange(cache.mask.shape[1]), q_slots])
  else:
    kv_mask, kv_slots = mask, q_slots

  def layer(h, xs):
    p, d, k_cache, v_cache = xs
    x = rms_norm(h, p["attn_norm"], c.norm_eps)
    q = _linear(x, p["wq"], d.get("wq"), delta_scale)
    k = _linear(x, p["wk"], d.get("wk"), delta_scale)
    v = _linear(x, p["wv"], d.get("wv"), delta_scale)
    if c.qkv_bias:
      q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    q = apply_rope(q.reshape(B, S, c.num_heads, c.head_dim), positions, inv_freq)
    k = apply_rope(k.reshape(B, S, c.num_kv_heads, c.head_dim), positions, inv_freq)
    v = v.reshape(B, S, c.num_kv_heads, c.head_dim)
    keys, values = k, v
    if k_cache is not None:
      keys = jnp.concatenate([k_cache, k.astype(k_cache.dtype)], axis=1)
      values = jnp.concatenate([v_cache, v.astype(v_cache.dtype)], axis=1)
    attn = _attention(q, keys, values, q_slots, kv_slots, kv_mask)
    h = h + _linear(attn, p["wo"], d.get("wo"), delta_scale)
    x = rms_norm(h, p["mlp_norm"], c.norm_eps)
    gate = _linear(x, p["w_gate"], d.get("w_gate"), delta_scale)
    up = _linear(x, p["w_up"], d.get("w_up"), delta_scale)
    h = h + _linear(jax.nn.silu(gate) * up, p["w_down"], d.get("w_down"), delta_scale)
    return h, (k, v)

  # The cache is read layer by layer as a scan input and only this block's keys/values come
  # out; one update-slice then writes them, so a decode step never copies the whole cache.
  cache_kv = (None, None) if cache is None else (cache.k, cache.v)
  h, (k_new, v_new) = jax.lax.scan(layer, h, (params["layers"], layer_deltas, *cache_kv))
  new_cache = None
  if cache is not None:
    start = (0, 0, cache_index, 0, 0)
    new_cache = KVCache(
      k=jax.lax.dynamic_update_slice(cache.k, k_new.astype(cache.k.dtype), start),
      v=jax.lax.dynamic_update_slice(cache.v, v_new.astype(cache.v.dtype), start),
      mask=jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache_index)),
    )
  if last_only:
    h = h[:, -1:]
  h = rms_norm(h, params["final_norm"], c.norm_eps)
  logits = _unembed(params, h, deltas, delta_scale).astype(jnp.float32)
  return logits, new_cache


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """RoPE positions for left-padded rows: 0 at the first real token."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


# ----------------------------------------------------------------------------- nnx module


class _Layers(nnx.Module):
  """All decoder layers' parameters, stacked on a leading L axis."""

  def __init__(self, config: ModelConfig, shapes: dict[str, tuple[int, ...]], rngs: nnx.Rngs):
    init = nnx.initializers.normal(0.02)
    for name, shape in shapes.items():
      if name.endswith("norm"):
        value = jnp.ones(shape, config.jnp_dtype)
      elif name.startswith("b"):
        value = jnp.zeros(shape, config.jnp_dtype)
      else:
        value = init(rngs.params(), shape, config.jnp_dtype)
      setattr(self, name, nnx.Param(value))


class Transformer(nnx.Module):
  """Llama/Qwen2 decoder (RMSNorm, RoPE, GQA, SwiGLU, optional qkv bias, tied head).

  The module is a thin shell over `forward`: hot loops split it once with `params(model)` and
  call `forward` (or `es_jax.sampling.generate`) on the plain parameter dict.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    shapes = param_shapes(config)
    init = nnx.initializers.normal(0.02)
    self.embed = nnx.Param(init(rngs.params(), shapes["embed"], config.jnp_dtype))
    self.layers = _Layers(config, shapes["layers"], rngs)
    self.final_norm = nnx.Param(jnp.ones(shapes["final_norm"], config.jnp_dtype))
    if not config.tie_embeddings:
      self.lm_head = nnx.Param(init(rngs.params(), shapes["lm_head"], config.jnp_dtype))

  def __call__(self, tokens: jax.Array, mask: jax.Array | None = None, **kwargs) -> jax.Array:
    """Full-sequence logits [B, S, V] (float32) for left-padded `tokens`."""
    if mask is None:
      mask = jnp.ones(tokens.shape, bool)
    positions = kwargs.pop("positions", None)
    if positions is None:
      positions = positions_from_mask(mask)
    logits, _ = forward(params(self), tokens, positions, config=self.config, mask=mask, **kwargs)
    return logits


def params(model: Transformer) -> Params:
  """The model's parameters as a plain nested dict of arrays (a pytree)."""
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def set_params(model: Transformer, new_params: Params) -> Transformer:
  """Writes a parameter dict (same structure and shapes) into `model` in place."""
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, new_params)
  nnx.update(model, state)
  return model


def from_params(config: ModelConfig, new_params: Params) -> Transformer:
  """Builds a Transformer holding `new_params`, checking every shape against `config`."""
  check_param_shapes(config, new_params)
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  return set_params(model, new_params)


def check_param_shapes(config: ModelConfig, new_params: Params, source: str = "params") -> None:
  expected = param_shapes(config)
  flat_expected = dict(_flatten(expected))
  flat_found = dict(_flatten(new_params, leaf=lambda x: hasattr(x, "shape")))
  missing = sorted(set(flat_expected) - set(flat_found))
  extra = sorted(set(flat_found) - set(flat_expected))
  if missing or extra:
    raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {extra}.")
  for name, shape in flat_expected.items():
    if tuple(flat_found[name].shape) != tuple(shape):
      raise ValueError(
        f"{source}: tensor {name!r} has shape {tuple(flat_found[name].shape)}, "
        f"expected {tuple(shape)} for this config."
      )


def _flatten(tree, prefix="", leaf=lambda x: isinstance(x, tuple)):
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, dict):
      yield from _flatten(v, name + ".", leaf)
    elif leaf(v):
      yield name, v
