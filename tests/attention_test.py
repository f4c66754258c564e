"""Attention tests: the blocked cache attention against the dense one, and the cache helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from es_jax.models.attention import (
  KVCache,
  blocked_cached_attention,
  cached_attention,
  take_rows,
  unstack_cache,
  write_mask,
  write_slots,
)


def _block(key, B=3, S=2, H=4, K=2, E=8, T=12):
  kq, kk, kv, km = jax.random.split(key, 4)
  q = jax.random.normal(kq, (B, S, H, E))
  k_t = jax.random.normal(kk, (B, K, E, T))
  v = jax.random.normal(kv, (B, K, T, E))
  kv_mask = jax.random.bernoulli(km, 0.8, (B, T))
  return q, k_t, v, kv_mask


@pytest.mark.parametrize("chunk", [1, 3, 4, 12])
@pytest.mark.parametrize("first_slot", [0, 5, 10])
def test_blocked_equals_dense_attention(key, chunk, first_slot):
  q, k_t, v, kv_mask = _block(key)
  S, T = q.shape[1], k_t.shape[-1]
  kv_mask = kv_mask.at[0, first_slot].set(True)  # row 0 always has a real slot
  q_slots = first_slot + jnp.arange(S)
  allowed = kv_mask[:, None, :] & (jnp.arange(T)[None, None, :] <= q_slots[None, :, None])
  dense = cached_attention(q, k_t, v, allowed)
  blocked = jax.jit(blocked_cached_attention, static_argnames="chunk")(
    q, k_t, v, kv_mask, first_slot, chunk=chunk
  )
  has_key = np.asarray(allowed.any(-1))  # [B, S]: queries with a real slot to attend to
  assert has_key[0].any()
  np.testing.assert_allclose(np.asarray(blocked)[has_key], np.asarray(dense)[has_key], atol=1e-5)
  # A query with nothing to attend to (it sits on padding) gets zeros, never NaN.
  assert np.isfinite(np.asarray(blocked)).all()
  assert (np.asarray(blocked)[~has_key] == 0).all()
  # A static first slot (a prefill) reads the same chunks as one dense block.
  static = blocked_cached_attention(q, k_t, v, kv_mask, first_slot, chunk=chunk)
  np.testing.assert_allclose(np.asarray(static)[has_key], np.asarray(dense)[has_key], atol=1e-5)


@pytest.mark.parametrize("chunk", [None, 3])
def test_per_row_slots_equal_each_row_at_its_own_scalar_slot(key, chunk):
  """A block index per row (rows at their own lengths) writes and reads, row by row, what the
  same row does alone with that index as the batch's scalar index."""
  q, k_t, v, kv_mask = _block(key, S=1)
  index = jnp.array([2, 7, 10])  # [B]
  k_new, v_new = jax.random.normal(jax.random.key(1), (2, 3, 1, 2, 8))  # [B, S, K, E] each
  k_rows, v_rows = write_slots(k_t, v, k_new, v_new, index)
  mask_rows = write_mask(kv_mask, jnp.ones((3, 1), bool), index)
  stacked = write_slots(k_t[None], v[None], k_new, v_new, index, lead=(0,))
  np.testing.assert_array_equal(np.asarray(stacked[0][0]), np.asarray(k_rows))
  np.testing.assert_array_equal(np.asarray(stacked[1][0]), np.asarray(v_rows))
  if chunk is None:
    T = k_t.shape[-1]
    allowed = mask_rows[:, None, :] & (jnp.arange(T)[None, None, :] <= index[:, None, None])
    out = cached_attention(q, k_rows, v_rows, allowed)
  else:
    out = blocked_cached_attention(q, k_rows, v_rows, mask_rows, index, chunk=chunk)
  for b in range(3):
    row = lambda x, b=b: x[b : b + 1]  # noqa: E731
    k_b, v_b = write_slots(row(k_t), row(v), row(k_new), row(v_new), index[b])
    np.testing.assert_array_equal(np.asarray(k_b), np.asarray(row(k_rows)))
    np.testing.assert_array_equal(np.asarray(v_b), np.asarray(row(v_rows)))
    m_b = write_mask(row(kv_mask), jnp.ones((1, 1), bool), index[b])
    np.testing.assert_array_equal(np.asarray(m_b), np.asarray(row(mask_rows)))
    alone = blocked_cached_attention(q[b : b + 1], k_b, v_b, m_b, index[b], chunk=chunk or 12)
    np.testing.assert_allclose(np.asarray(out[b]), np.asarray(alone[0]), atol=1e-5)


def test_blocked_attention_reads_no_slot_after_the_block(key):
  """Garbage (NaN) in the slots after the block's chunk must not reach the output."""
  q, k_t, v, kv_mask = _block(key, S=1)
  first_slot, chunk = 3, 4  # the block ends in chunk 0: slots 4.. are never read
  k_t = k_t.at[..., 4:].set(jnp.nan)
  v = v.at[:, :, 4:].set(jnp.nan)
  for slot in (first_slot, jnp.int32(first_slot)):  # static and traced
    out = blocked_cached_attention(q, k_t, v, kv_mask, slot, chunk=chunk)
    assert np.isfinite(np.asarray(out)).all()


def test_blocked_attention_rejects_a_ragged_cache(key):
  q, k_t, v, kv_mask = _block(key)
  with pytest.raises(ValueError, match="cache length 12 is not a multiple of chunk=5"):
    blocked_cached_attention(q, k_t, v, kv_mask, 0, chunk=5)


def test_take_rows_stacked_and_unstacked():
  k = jnp.arange(2 * 3 * 1 * 2 * 4.0).reshape(2, 3, 1, 2, 4)  # [L, B, K, E, T]
  v = -jnp.arange(2 * 3 * 1 * 4 * 2.0).reshape(2, 3, 1, 4, 2)
  mask = jnp.arange(12).reshape(3, 4) % 2 == 0
  cache = KVCache(k, v, mask)
  rows = jnp.array([2, 0])
  stacked, unstacked = take_rows(cache, rows), take_rows(unstack_cache(cache), rows)
  np.testing.assert_array_equal(stacked.k, k[:, np.array([2, 0])])
  np.testing.assert_array_equal(stacked.v, v[:, np.array([2, 0])])
  np.testing.assert_array_equal(stacked.mask, mask[np.array([2, 0])])
  for layer in range(2):
    np.testing.assert_array_equal(unstacked.k[layer], k[layer][np.array([2, 0])])
    np.testing.assert_array_equal(unstacked.v[layer], v[layer][np.array([2, 0])])
