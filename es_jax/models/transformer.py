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
pairs only for the matrices that are perturbed; EGGROLL-style ES (docs/method.md §2) passes
c = sigma / sqrt(R).

Decoding: the KV cache and attention live in `es_jax.models.attention`. `forward` also takes
the layers unstacked (`unstack_layers`) with a per-layer cache (`unstack_cache`) and runs them
as an unrolled loop: the fast CPU decode path, as XLA:CPU copies a scanned layer's weights out
of the stack on every step (about a quarter of a SmolLM2 decode step's op time).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from es_jax.models.attention import (
  KVCache,
  allowed_slots,
  write_mask,
)
from es_jax.models.config import ModelConfig
from es_jax.models.layers import (  # noqa: F401 (rms_norm, apply_rope: public here too)
  Block,
  apply_rope,
  linear,
  low_rank,
  rms_norm,
  rope_inv_freq,
  run_scanned,
  run_scanned_cached,
  run_unrolled,
)

Params = dict[str, Any]

LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def is_hook_leaf(names: tuple[Any, ...]) -> bool:
  """Whether ``forward(deltas=...)`` takes a low-rank delta for the parameter at ``names``.

  ``names`` is the parameter's path as plain keys (``noise.Leaf.names``): ``("embed",)``,
  ``("lm_head",)`` or ``("layers", m)`` for ``m`` in ``LAYER_MATRICES``. Per-layer tensors are
  stacked on a leading axis under ``"layers"``, which is how the noise tells a stack of matrices
  ``[L, m, n]`` from a stack of vectors ``[L, n]`` (``noise.STACKED_PREFIXES``).
  """
  if names in (("embed",), ("lm_head",)):
    return True
  return len(names) == 2 and names[0] == "layers" and names[1] in LAYER_MATRICES


def unstack_layers(tree: Params) -> Params:
  """`params` (or a `deltas` dict) with "layers" as a tuple of per-layer dicts.

  `forward` runs such layers as an unrolled loop instead of a scan. The slices are copies: do
  this once outside a decode loop (`generate` does), not per step. Under jit, put an
  `jax.lax.optimization_barrier` on the result or XLA may sink the slices back into the loop.
  """
  layers = tree.get("layers")
  if layers is None or isinstance(layers, (list, tuple)):
    return tree
  leaves = jax.tree.leaves(layers)
  if not leaves:
    return tree
  n = leaves[0].shape[0]
  return {**tree, "layers": tuple(jax.tree.map(lambda x, i=i: x[i], layers) for i in range(n))}


def cast_params(tree: Any, dtype: Any) -> Any:
  """`tree` with every floating-point array cast to `dtype` (integer and key leaves untouched).

  Mixed precision: master weights may be float32 while the model computes in its config's dtype
  (bf16 for the paper's checkpoints); `forward` casts with this, and hot loops cast once before
  the loop. A no-op (no copy) for leaves that already have `dtype`.
  """
  dtype = jnp.dtype(dtype)

  def cast(x):
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
      return x.astype(dtype)
    return x

  return jax.tree.map(cast, tree)


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


def _embed(params: Params, tokens: jax.Array, deltas: Params, scale) -> jax.Array:
  h = jnp.take(params["embed"], tokens, axis=0)  # [B, S, D]
  if deltas.get("embed") is not None:
    a, b = deltas["embed"]  # [V, R], [D, R]
    h = h + (scale * (jnp.take(a, tokens, axis=0) @ b.T)).astype(h.dtype)
  return h


def _unembed(params: Params, h: jax.Array, deltas: Params, scale) -> jax.Array:
  if "lm_head" in params:
    return linear(h, params["lm_head"], deltas.get("lm_head"), scale)
  logits = h @ params["embed"].T
  if deltas.get("embed") is not None:
    a, b = deltas["embed"]  # tied head: h @ (W + c a bᵀ)ᵀ = h Wᵀ + c (h b) aᵀ
    logits = logits + (scale * low_rank(h, b, a)).astype(h.dtype)
  return logits


# ----------------------------------------------------------------------------- forward


def _layer_deltas(layer_deltas, layers, unrolled: bool):
  """The layers' (a, b) pairs in the layout of `layers`: a dict of stacked pairs (scan) or one
  dict per layer (unrolled), without the None entries."""
  if isinstance(layer_deltas, dict):
    layer_deltas = {k: v for k, v in layer_deltas.items() if v is not None}
    if unrolled:
      layer_deltas = unstack_layers({"layers": layer_deltas})["layers"] if layer_deltas else ()
  elif not unrolled:
    raise ValueError("forward: unstacked layer deltas need unstacked layers (`unstack_layers`).")
  if unrolled:
    layer_deltas = [{k: v for k, v in d.items() if v is not None} for d in layer_deltas]
    layer_deltas = layer_deltas or [{}] * len(layers)
  return layer_deltas


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardMode:
  """How `forward` runs a block of tokens: against a KV cache or not, which positions' logits it
  returns, what its backward pass saves. The default is a plain full-sequence pass.

  Attributes:
    cache: if given, this block is written to slots [cache_index, cache_index + S) (which must
      fit: cache_index + S <= T) and attends to every valid slot up to its own; the updated
      cache, stacked or per-layer like the one given, is returned.
    cache_index: first cache slot of this block: a traced scalar, or [B] (each row's own, for
      rows at different lengths; a scatter).
    kv_chunk: with a cache, read only its first kv_chunk slots while they hold the block
      (`attention.bucketed_cached_attention`); None reads every slot.
    last_only: return logits of the last position only ([B, 1, V]), for prefill; an int n >= 1
      (static), of the last n positions ([B, n, V]): the lm head and its backward pass then
      cover those rows only (GRPO scores the completion's T + 1 positions, not the prompt's).
    remat: recompute each scanned layer in the backward pass instead of saving its activations
      (`jax.checkpoint`; no-cache, scanned path only). A layer's attention scores are
      [B, heads, S, S] float32: at S = 8k saving them for every layer is ~100 GiB per row, so
      training long completions needs this; it costs about one more forward pass.
  """

  cache: KVCache | None = None
  cache_index: jax.Array | int = 0
  kv_chunk: int | None = None
  last_only: bool | int = False
  remat: bool = False


def forward(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  *,
  config: ModelConfig,
  mask: jax.Array | None = None,
  deltas: Params | None = None,
  delta_scale: jax.Array | float | None = None,
  mode: ForwardMode = ForwardMode(),
) -> tuple[jax.Array, KVCache | None]:
  """Runs the decoder on a block of tokens.

  Args:
    params: nested parameter dict (see `param_shapes`). Its "layers" may also be unstacked
      (`unstack_layers`): they then run as an unrolled loop instead of a scan (the CPU decode
      path; needs an unstacked cache).
    tokens: [B, S] int token ids.
    positions: [B, S] RoPE positions (for left-padded rows: cumsum(mask) - 1).
    config: the model's config (static).
    mask: [B, S] bool, False on padding. Defaults to all True.
    deltas: optional low-rank perturbations, a dict mirroring `params` with (a, b) pairs on
      matrices (layer matrices carry a leading L axis). See the module docstring.
    delta_scale: c in W + c a bᵀ.
    mode: the cache, its slot and read window, the logits returned, remat (`ForwardMode`).

  Returns:
    (logits [B, S, V] float32, updated cache or None).

  Parameters of another floating dtype than `config.dtype` (e.g. float32 master weights of a
  bf16 model) are cast to it here, so the compute dtype is always the config's.
  """
  c = config
  cache, cache_index, last_only = mode.cache, mode.cache_index, mode.last_only
  B, S = tokens.shape
  params = cast_params(params, c.jnp_dtype)
  deltas = deltas or {}
  layers = params["layers"]
  unrolled = isinstance(layers, (list, tuple))
  layer_deltas = _layer_deltas(deltas.get("layers") or {}, layers, unrolled)
  mask = jnp.ones((B, S), bool) if mask is None else mask
  inv_freq = rope_inv_freq(c)
  h = _embed(params, tokens, deltas, delta_scale).astype(c.jnp_dtype)
  if cache is not None:
    # This block is written to the cache first, then attends to every valid slot up to itself.
    kv_mask = write_mask(cache.mask, mask, cache_index)  # [B, T]
    kv_slots = jnp.arange(kv_mask.shape[1])
  else:
    kv_mask, kv_slots = mask, cache_index + jnp.arange(S)
  allowed = allowed_slots(kv_mask, kv_slots, cache_index, S)  # [B, S, T]

  blk = Block(
    c,
    positions,
    inv_freq,
    allowed,
    cache is not None,
    kv_mask,
    cache_index,
    mode.kv_chunk,
    delta_scale,
  )
  if unrolled:
    h, new_cache = run_unrolled(blk, h, layers, layer_deltas, cache)
  elif cache is None:
    h, new_cache = run_scanned(blk, h, layers, layer_deltas, mode.remat), None
  else:
    h, new_cache = run_scanned_cached(blk, h, layers, layer_deltas, cache)
  h = h[:, -int(last_only) :] if last_only else h  # True: the last position
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
  call `forward` (or `es_jax.decode.sampling.generate`) on the plain parameter dict.
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
