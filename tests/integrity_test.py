"""Tests for es_jax.persist.integrity: array digests independent of sharding that see one flipped
bit."""

import jax
import jax.numpy as jnp
import numpy as np

from es_jax.persist import integrity


def test_manifest_digest_ignores_sharding_and_sees_one_bit(key):
  x = jax.random.normal(key, (16, 8), jnp.float32)
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  sharded = jax.device_put(x, jax.NamedSharding(mesh, jax.P("pop")))
  plain = integrity.tree_manifest({"x": x, "b": x.astype(jnp.bfloat16), "k": True})
  assert integrity.tree_manifest({"x": sharded})["x"] == plain["x"]
  # Leaves on different devices (a mesh and one other device) are digested separately.
  mixed = integrity.tree_manifest({"x": sharded, "y": jax.device_put(x, jax.devices()[3])})
  assert mixed["x"] == mixed["y"] == plain["x"]
  bits = np.asarray(x).view(np.uint32).copy()
  bits[5, 3] ^= 1 << 31
  flipped = integrity.tree_manifest({"x": jnp.asarray(bits.view(np.float32))})
  assert flipped["x"]["digest"] != plain["x"]["digest"]
  assert plain["b"]["dtype"] == "bfloat16" and plain["k"]["shape"] == []


def test_tree_digest_ignores_sharding_and_sees_one_bit():
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from es_jax.devices import sharding

  tree = {"a": jnp.arange(64.0).reshape(8, 8), "b": {"c": jnp.ones(3, jnp.bfloat16)}}
  mesh = sharding.make_mesh(8, 1)
  split = {**tree, "a": jax.device_put(tree["a"], NamedSharding(mesh, P("pop")))}
  assert len(split["a"].sharding.device_set) == 8
  digest = integrity.tree_digest(tree)
  assert integrity.tree_digest(split) == digest and len(digest) == 16
  bits = jax.lax.bitcast_convert_type(tree["a"], jnp.uint32).at[3, 5].add(1)
  flipped = {**tree, "a": jax.lax.bitcast_convert_type(bits, jnp.float32)}
  assert integrity.tree_digest(flipped) != digest
  assert integrity.tree_digest({**tree, "b": {"c": jnp.ones(3)}}) != digest  # dtype counts
  # numpy leaves count the same as jax ones, bfloat16 (an ml_dtypes type, kind "V") included
  host = jax.tree.map(np.asarray, tree)
  assert host["b"]["c"].dtype.kind == "V" and integrity.tree_digest(host) == digest


def test_manifest_same_for_any_batching(key, monkeypatch):
  """Leaves are digested in byte-bounded batches (memory); the digests do not depend on them."""
  tree = {
    "a": jax.random.normal(key, (64, 32)),
    "b": [jnp.arange(10, dtype=jnp.int32), jnp.ones((3, 5), jnp.bfloat16)],
    "k": jax.random.split(key, 2),
    "s": np.float32(2.5),
  }
  whole = integrity.tree_manifest(tree)
  monkeypatch.setattr(integrity, "_BATCH_BYTES", 16)  # batches of at most 16 bytes
  named = [("x", np.zeros(4)), ("y", np.zeros(1)), ("z", np.zeros(1)), ("w", np.zeros(1))]
  assert integrity._batches([0, 1, 2, 3], named) == [[0], [1, 2], [3]]
  assert integrity.tree_manifest(tree) == whole
  assert len({v["digest"] for v in whole.values()}) == len(whole)
