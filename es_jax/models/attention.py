"""Attention and the KV cache: the dense form, and the bucketed form whose cost follows the tokens.

Axis letters as in `es_jax.models.transformer` (B batch, S query length, T cache slots, H query
heads, K key/value heads, G = H / K, E head dim).

`cached_attention` reads every slot of the cache, masked: a decode step costs the whole allocated
length (prompt + budget) however few tokens are in it. `bucketed_cached_attention` reads the
shortest of two static prefixes of the cache (its first `chunk` slots, or all T:
`prefix_lengths`) that holds every slot up to the block's own: the dense read on a shorter cache,
picked by one `lax.switch` per layer, so a step within the first chunk reads the chunk only, and
past it the step is the dense step itself. Equal to the dense form up to float rounding (the
softmax sums the same terms without the masked slots' zeros).

A block's first slot (`index`) is one scalar for the whole batch (rows aligned by left padding:
`es_jax.decode.sampling.generate`) or one per row, [B] (rows at their own lengths:
`es_jax.decode.queue`, where a row that ends takes the next waiting prompt); per-row writes are
a scatter, and the bucketed read takes the prefix of the furthest row.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from es_jax.models.config import ModelConfig

_NEG = jnp.finfo(jnp.float32).min  # a masked score: exp(_NEG - m) is 0 for any real m


class KVCache(NamedTuple):
  """Functional KV cache. Slots are shared by the batch; left padding keeps rows aligned.

  Keys are stored transposed ([..., E, T]) so the score matmul q·kᵀ reads them as a plain
  [E, T] right-hand side (about twice as fast on CPU as contracting over the minor axis of a
  [T, E] block). `k` and `v` are either stacked on a leading L axis (what `init_cache` makes and
  the scanned layers use) or tuples of L per-layer arrays (`unstack_cache`, for the unrolled
  decode loop over `unstack_layers` parameters).
  """

  k: jax.Array | tuple[jax.Array, ...]  # [L, B, K, E, T], or L x [B, K, E, T]
  v: jax.Array | tuple[jax.Array, ...]  # [L, B, K, T, E], or L x [B, K, T, E]
  mask: jax.Array  # [B, T] bool: slot holds a real (non-pad) token.


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
  """An empty stacked cache with `max_len` slots (see `KVCache` for the layout)."""
  dtype = dtype or config.jnp_dtype
  c = config
  shape = (c.num_layers, batch_size, c.num_kv_heads, max_len, c.head_dim)
  return KVCache(
    k=jnp.zeros((*shape[:3], c.head_dim, max_len), dtype),
    v=jnp.zeros(shape, dtype),
    mask=jnp.zeros((batch_size, max_len), bool),
  )


def unstack_cache(cache: KVCache) -> KVCache:
  """The same cache with per-layer key/value arrays (one copy of the cache)."""
  if isinstance(cache.k, tuple):
    return cache
  return KVCache(k=tuple(cache.k), v=tuple(cache.v), mask=cache.mask)


def take_rows(cache: KVCache, rows: jax.Array) -> KVCache:
  """The cache of batch rows `rows` [B'] (int), in that order: one copy of those rows."""
  if isinstance(cache.k, tuple):
    take = lambda x: jnp.take(x, rows, axis=0)  # noqa: E731
    return KVCache(tuple(map(take, cache.k)), tuple(map(take, cache.v)), take(cache.mask))
  take = lambda x: jnp.take(x, rows, axis=1)  # noqa: E731
  return KVCache(take(cache.k), take(cache.v), jnp.take(cache.mask, rows, axis=0))


def take_group_rows(cache: KVCache, keep: jax.Array) -> KVCache:
  """`take_rows` within G contiguous groups of batch rows: keep [G, B'] indexes rows of each
  group of B / G rows; the result has G * B' rows, group-major. A gather batched over the groups,
  so a batch sharded by groups stays on its devices."""
  G = keep.shape[0]

  def take(x, axis):
    grouped = x.reshape(*x.shape[:axis], G, -1, *x.shape[axis + 1 :])
    out = jax.vmap(lambda y, k: jnp.take(y, k, axis=axis), in_axes=(axis, 0), out_axes=axis)(
      grouped, keep
    )
    return out.reshape(*x.shape[:axis], -1, *x.shape[axis + 1 :])

  if isinstance(cache.k, tuple):
    k, v = tuple(take(x, 0) for x in cache.k), tuple(take(x, 0) for x in cache.v)
  else:
    k, v = take(cache.k, 1), take(cache.v, 1)
  return KVCache(k, v, take(cache.mask, 0))


def _row_slots(index, S: int) -> jax.Array:
  """The block's query slots: [1, S] for a scalar `index`, [B, S] for one per row."""
  return jnp.reshape(index, (-1, 1)) + jnp.arange(S)


def write_mask(cache_mask, mask, index):
  """cache_mask [B, T] with the block's mask [B, S] written at slots [index, index + S)."""
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice(cache_mask, mask, (0, index))
  return jax.vmap(lambda m, new, i: jax.lax.dynamic_update_slice(m, new, (i,)))(
    cache_mask, mask, index
  )


def allowed_slots(kv_mask, kv_slots, index, S: int):
  """[B, S, T] bool: query s of each row attends to its real slots at or before its own."""
  q_slots = _row_slots(index, S)
  return kv_mask[:, None, :] & (kv_slots[None, None, :] <= q_slots[:, :, None])


def write_slots(k_cache, v_cache, k, v, index, lead=()):
  """Writes a block's keys and values k, v [B, S, K, E] at slots [index, index + S) of
  k_cache [..., B, K, E, T] and v_cache [..., B, K, T, E] (`lead` indexes the leading axes;
  `index` a scalar or [B])."""
  n = len(lead)
  k_t = k.transpose(0, 2, 3, 1).astype(k_cache.dtype)  # [B, K, E, S]
  v = v.transpose(0, 2, 1, 3).astype(v_cache.dtype)  # [B, K, S, E]
  if jnp.ndim(index) == 0:
    k_t, v = k_t.reshape((1,) * n + k_t.shape), v.reshape((1,) * n + v.shape)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k_t, (*lead, 0, 0, 0, index))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (*lead, 0, 0, index, 0))
    return k_cache, v_cache

  def row(kc, vc, kb, vb, i):  # one row: the B axis vmapped away
    kc = jax.lax.dynamic_update_slice(kc, kb.reshape((1,) * n + kb.shape), (*lead, 0, 0, i))
    vc = jax.lax.dynamic_update_slice(vc, vb.reshape((1,) * n + vb.shape), (*lead, 0, i, 0))
    return kc, vc

  return jax.vmap(row, in_axes=(n, n, 0, 0, 0), out_axes=n)(k_cache, v_cache, k_t, v, index)


def self_attention(q, k, v, allowed):
  """Grouped-query attention over this block's own keys. q [B,S,H,E]; k, v [B,S,K,E];
  allowed [B,S,S] bool."""
  B, S, H, E = q.shape
  K = k.shape[2]
  qg = q.reshape(B, S, K, H // K, E)
  scores = jnp.einsum("bskge,btke->bkgst", qg, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(E))
  scores = jnp.where(allowed[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgst,btke->bskge", probs, v)
  return out.reshape(B, S, H * E)


def _grouped(q, K):
  """q [B,S,H,E] -> [B, K, G*S, E]: one KV head's queries as rows (g, s)."""
  B, S, H, E = q.shape
  return q.reshape(B, S, K, H // K, E).transpose(0, 2, 3, 1, 4).reshape(B, K, -1, E)


def _ungrouped(out, S):
  """[B, K, G*S, E] -> [B, S, H*E]."""
  B, K, GS, E = out.shape
  return out.reshape(B, K, GS // S, S, E).transpose(0, 3, 1, 2, 4).reshape(B, S, -1)


def cached_attention(q, k_t, v, allowed):
  """Grouped-query attention over every slot of a cache layer (dense). q [B,S,H,E];
  k_t [B,K,E,T] (keys transposed); v [B,K,T,E]; allowed [B,S,T] bool."""
  B, S, H, E = q.shape
  K = k_t.shape[1]
  # Rows (g, s) of one KV head's queries form a plain [G*S, E] @ [E, T] matmul; in a decode step
  # (S = 1) the transposes are free and XLA:CPU keeps both matmuls on its fast dot path.
  qg = _grouped(q, K)
  scores = jnp.einsum("bkqe,bket->bkqt", qg, k_t, preferred_element_type=jnp.float32)
  scores = scores.reshape(B, K, H // K, S, -1) * (1.0 / math.sqrt(E))
  scores = jnp.where(allowed[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(B, K, H // K * S, -1)
  return _ungrouped(jnp.einsum("bkqt,bkte->bkqe", probs, v), S)


def prefix_lengths(slots: int, chunk: int) -> tuple[int, ...]:
  """The cache prefixes a bucketed read picks from, shortest first: the first `chunk` slots and
  the whole cache. Two on purpose: every prefix compiles one more copy of every layer's
  attention (on SmolLM2's shapes a decode step's compile grew about 0.2x per extra prefix), so
  the read follows the tokens at the start of a decode, where most short completions end."""
  return (chunk, slots) if chunk < slots else (slots,)


def bucketed_cached_attention(q, k_t, v, allowed, first_slot, *, chunk: int):
  """`cached_attention` over the shortest cache prefix of `prefix_lengths` that holds the block.

  Each prefix is the dense read itself on a shorter cache (a static slice), so past the first
  `chunk` slots the step is the dense step, and within them one `lax.switch` picks the short
  read.

  Args:
    q: [B, S, H, E] queries of the block at slots [first_slot, first_slot + S).
    k_t: [B, K, E, T] keys (transposed); v: [B, K, T, E].
    allowed: [B, S, T] bool (`allowed_slots`): query s attends to slot t.
    first_slot: the block's first slot, a scalar or one per row [B] (every row then reads the
      prefix of the furthest row). A Python int (a prefill) picks its prefix statically.
    chunk: the shortest prefix read (static).

  Returns:
    [B, S, H*E] in q's dtype, `cached_attention`'s up to float rounding (the softmax sums the
    same terms without the masked zeros).
  """
  S, T = q.shape[1], k_t.shape[-1]
  lengths = prefix_lengths(T, chunk)

  def read(n, q, k_t, v, allowed):
    if n == T:
      return cached_attention(q, k_t, v, allowed)
    return cached_attention(q, k_t[..., :n], v[:, :, :n], allowed[..., :n])

  if isinstance(first_slot, int):  # a static block (a prefill)
    return read(next(n for n in lengths if n >= first_slot + S), q, k_t, v, allowed)
  end = jnp.max(first_slot) + S  # slots the furthest query needs
  branch = sum((end > n).astype(jnp.int32) for n in lengths[:-1])
  branches = [functools.partial(read, n) for n in lengths]
  return jax.lax.switch(branch, branches, q, k_t, v, allowed)
