"""The full-rank Gaussian noise of one leaf, drawn in blocks (part of the noise definition).

A leaf of shape ``s`` (``n`` entries) gets float32 iid N(0, 1) noise from its leaf key
(``noise.leaf_key``), drawn in blocks of the flattened leaf: ``B = min(NOISE_BLOCK, n)``,
``nb = ceil(n / B)`` blocks; block ``b`` is ``jax.random.normal(fold_in(key_il, b), (B,))`` placed
at ``s_b = min(b B, n - B)``, and it supplies the entries from ``b B`` on (the last block, shifted
back to fit, leaves the entries before ``b B`` to block ``b - 1``). Every entry comes from exactly
one (block key, offset), so the entries stay iid. Blocks let every consumer (perturbation, the
update's accumulation) work one block at a time: their memory is ``O(NOISE_BLOCK)``, never a noise
array the size of a leaf. ``leaf_normal`` draws the same numbers in the leaf's own layout, for
parameters split over a mesh axis.
"""

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

# Entries per full-rank noise block (part of the noise definition: changing it changes the noise).
# 2^16 float32 = 256 KiB: the generator's working set stays in cache on CPU, and a 135M-parameter
# model is ~2k blocks, few enough loop steps for an accelerator.
NOISE_BLOCK = 2**16


def block_normal(key: jax.Array, b: int | jax.Array, size: int) -> jax.Array:
  """Block ``b`` of the full-rank noise drawn from ``key`` (a leaf key): float32 ``[size]``.

  Drawn flat: a multi-dimensional draw makes XLA constant-fold the counter iotas, which took
  seconds to compile on CPU (jax 0.10, ``jax_threefry_partitionable``).
  """
  return jax.random.normal(jax.random.fold_in(key, b), (size,), jnp.float32)


def map_noise_blocks(flat: jax.Array, block_fn: Any) -> jax.Array:
  """Applies ``block_fn(b, values) -> new values`` to each noise block of a flat ``[n]`` array.

  The blocks are those of the full-rank noise (module docstring): ``values`` is the ``[B]``
  slice at ``s_b``, and only the entries that block ``b`` supplies are replaced, so the result
  combines ``flat`` with the noise entry by entry. Runs as a ``fori_loop`` updating ``flat`` in
  place: besides the result, memory is ``O(B)``. ``block_fn`` draws its noise with
  ``block_normal(leaf_key, b, B)``.
  """
  n = flat.shape[0]
  if n == 0:
    return flat
  size = min(NOISE_BLOCK, n)
  num_blocks = -(-n // size)
  if num_blocks == 1:
    return block_fn(0, flat)

  def body(b, out):
    start = jnp.minimum(b * size, n - size)
    values = jax.lax.dynamic_slice(out, (start,), (size,))
    new = block_fn(b, values)
    if n % size:  # the last block overlaps its predecessor: keep the entries it does not supply
      new = jnp.where(start + jnp.arange(size) < b * size, values, new)
    return jax.lax.dynamic_update_slice(out, new, (start,))

  return jax.lax.fori_loop(0, num_blocks, body, flat)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  """uint32 ``[*shape]``: each entry's row-major position in the flattened leaf, from iotas (so
  the SPMD partitioner computes only the entries of a device's shard)."""
  flat = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(range(len(shape))):
    flat = flat + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
    stride *= shape[d]
  return flat


def leaf_normal(key: jax.Array, shape: Sequence[int]) -> jax.Array:
  """The full-rank noise of a leaf from its leaf key, drawn entry by entry in the leaf's layout.

  Bit-identical to the block definition (module docstring) under the partitionable threefry
  PRNG (``jax_threefry_partitionable``, jax's default): there ``normal(k, (B,))[o]`` is
  ``sqrt(2) erfinv(u(threefry2x32(k, (0, o))))``, a function of the counter ``o`` alone, so
  entry ``f`` of the flattened leaf is that function at ``(fold_in(key, b(f)), f - s_b(f))``.
  Computed this way, no flattened copy of the leaf exists: under a parameter sharding (e.g.
  ``sharding.param_shardings`` over ``'model'``) every device draws only its own shard's entries,
  with no all-gather, and fused into its consumer (the perturbation or the update's accumulator)
  nothing larger than the leaf is materialised. Other PRNG implementations fall back to the
  blocks (``map_noise_blocks``).

  Args:
    key: the leaf key (``leaf_key(member_key, l)``).
    shape: the leaf's shape.

  Returns:
    float32 ``[*shape]``.
  """
  shape = tuple(int(d) for d in shape)
  n = math.prod(shape)
  if n == 0 or n >= 2**32 or not _counter_based(key):
    return normal(key, shape)
  size = min(NOISE_BLOCK, n)
  num_blocks = -(-n // size)
  flat = _flat_index(shape)
  block = jnp.minimum(flat // jnp.uint32(size), jnp.uint32(num_blocks - 1))
  offset = flat - jnp.minimum(block * jnp.uint32(size), jnp.uint32(n - size))
  block_keys = jax.vmap(lambda b: jax.random.key_data(jax.random.fold_in(key, b)))(
    jnp.arange(num_blocks, dtype=jnp.uint32)
  )  # [nb, 2] uint32: the block keys of block_normal
  k = block_keys[block]  # [*shape, 2]
  hi, lo = threefry2x32_p.bind(k[..., 0], k[..., 1], jnp.zeros(shape, jnp.uint32), offset)
  bits = hi ^ lo  # jax.random.bits (32-bit, partitionable) at counter `offset`
  # jax.random.uniform(minval=nextafter(-1, 0), maxval=1), then sqrt(2) erfinv: jax.random.normal.
  mantissa = jax.lax.shift_right_logical(bits, jnp.uint32(32 - 23)) | jnp.uint32(0x3F800000)
  floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)
  lo_val = jnp.float32(np.nextafter(np.float32(-1.0), np.float32(0.0)))
  u = jax.lax.max(lo_val, floats * (jnp.float32(1.0) - lo_val) + lo_val)
  return jnp.float32(np.sqrt(2)) * jax.lax.erf_inv(u)


def _counter_based(key: jax.Array) -> bool:
  """Whether ``key`` draws as ``leaf_normal`` assumes: the threefry PRNG, partitionable mode."""
  if not jax.config.jax_threefry_partitionable:
    return False
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return str(jax.random.key_impl(key)) == "threefry2x32"
  return key.shape == (2,) and key.dtype == jnp.uint32  # raw uint32[2] keys are threefry


def normal(key: jax.Array, shape: Sequence[int]) -> jax.Array:
  """float32 N(0, 1) of ``shape``: the full-rank noise of a leaf from its leaf key, by blocks."""
  shape = tuple(int(d) for d in shape)
  n = math.prod(shape)
  return map_noise_blocks(
    jnp.zeros((n,), jnp.float32), lambda b, v: block_normal(key, b, v.shape[0])
  ).reshape(shape)
