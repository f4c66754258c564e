"""Integrity digests: of a pytree's arrays (independent of sharding), and of a checkpoint's files.

A checkpoint (`es_jax.persist.checkpoint`) stores, as one more item of its atomic save, a manifest
of the shape, dtype and 64-bit digest of each array it holds and a SHA-256 of its meta JSON
(`tree_manifest`, `meta_digest`); a restore recomputes them and `check_manifest` names the first
array that differs. On a local file system a step also gets `FILES_MANIFEST` (size and SHA-256
of every file), which `damaged_files` compares against when a step fails to restore.
`tree_digest` is one hex digest of a whole pytree (which parameters a result was computed from).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from es_jax.es import noise


class CorruptCheckpointError(ValueError):
  """A checkpoint read without error, but its contents disagree with its integrity manifest."""


MANIFEST_VERSION = 1
FILES_MANIFEST = "integrity_files.json"
DIGEST = "u32-weighted-sum-x2"  # see _leaf_digest


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 that mixes every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _as_words(x: jax.Array) -> jax.Array:
  """The bytes of `x` as a flat uint32 vector (one word per element, two for 64-bit types)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([x.real, x.imag], axis=-1)
  size = x.dtype.itemsize
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  elif size == 8:
    words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
  else:
    words = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size])
    words = words.astype(jnp.uint32)
  return words.reshape(-1)


def _leaf_digest(x: jax.Array) -> jax.Array:
  """Two 32-bit digests of an array's bytes, independent of how the array is sharded.

  Each is Σ_i w_i c_i mod 2^32 over the words w_i, with odd position weights c_i from a mixing
  function of the index i (two different seeds): a sum is exact and order-free, so any sharding
  gives the same digest, and changing one word by d changes the sum by d·c_i ≠ 0 (c_i odd).
  """
  words = _as_words(x)
  i = jax.lax.iota(jnp.uint32, words.shape[0])
  out = []
  for seed in (0x9E3779B9, 0x7F4A7C15):
    weights = _fmix32(i ^ jnp.uint32(seed)) | jnp.uint32(1)
    out.append(jnp.sum(words * weights, dtype=jnp.uint32))
  return jnp.stack(out)


@jax.jit
def _digests(leaves: list[jax.Array]) -> jax.Array:
  return jnp.stack([_leaf_digest(x) for x in leaves]) if leaves else jnp.zeros((0, 2), jnp.uint32)


def tree_digest(tree: Any) -> str:
  """A hex digest of `tree`'s arrays (paths, shapes, dtypes and bytes; the per-array digests of
  the checkpoint manifest), independent of sharding and the same on every host: which parameters
  a result was computed from (for example the final evaluation's records, so that a run extended
  to more steps does not reuse them)."""
  manifest = json.dumps(tree_manifest(tree), sort_keys=True).encode()
  return hashlib.sha256(manifest).hexdigest()[:16]


def _path_name(path: tuple[Any, ...]) -> str:
  """A pytree path as "a/b/0/c", the same for a NamedTuple and the dict Orbax restores it as."""
  return "/".join(map(str, noise.path_names(path)))


def tree_manifest(tree: Any) -> dict[str, dict[str, Any]]:
  """{path: {"shape", "dtype", "digest"}} for every array leaf of `tree` (scalars included)."""
  named = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not isinstance(leaf, jax.Array):
      if not isinstance(leaf, np.ndarray | np.generic | int | float | bool):
        continue
      leaf = np.asarray(leaf)
      # Numbers only; ml_dtypes' bfloat16 / float8 numpy arrays have kind "V" but are floats.
      if leaf.dtype.kind not in "biufc" and not jnp.issubdtype(leaf.dtype, jnp.floating):
        continue
    named.append((_path_name(path), leaf))
  if not named:
    return {}
  # One jitted call per set of devices: a computation cannot mix arrays of different meshes.
  groups: dict[Any, list[int]] = {}
  for i, (_, x) in enumerate(named):
    devices = frozenset(x.sharding.device_set) if isinstance(x, jax.Array) else None
    groups.setdefault(devices, []).append(i)
  digests: list[Any] = [None] * len(named)
  for idx in (batch for group in groups.values() for batch in _batches(group, named)):
    out = _digests([jnp.asarray(named[i][1]) for i in idx])
    if jax.process_count() > 1 and not out.is_fully_replicated:
      out = multihost_utils.process_allgather(out, tiled=True)
    elif jax.process_count() > 1:
      out = out.addressable_data(0)
    for i, d in zip(idx, np.asarray(out), strict=True):
      digests[i] = d
  return {
    name: {
      "shape": list(np.shape(x)),
      "dtype": str(x.dtype),
      "digest": f"{int(d[0]):08x}{int(d[1]):08x}",
    }
    for (name, x), d in zip(named, digests, strict=True)
  }


# Leaves digested per jitted call: XLA:CPU materialises each word·weight product before summing
# it (two uint32 words per input word), so one call over a whole training state (params and
# AdamW moments, 1.6 GB for SmolLM2-135M) held 3.2 GB more for the save; bounded batches hold at
# most twice the larger of this and the largest leaf. The sums do not depend on the batching.
_BATCH_BYTES = 64 * 2**20


def _batches(indices: list[int], named: list[tuple[str, Any]]) -> list[list[int]]:
  """`indices` in order, cut into runs of at most `_BATCH_BYTES` (a larger leaf alone)."""
  out: list[list[int]] = []
  size = _BATCH_BYTES
  for i in indices:
    nbytes = int(named[i][1].nbytes)
    if not out or size + nbytes > _BATCH_BYTES:
      out.append([])
      size = 0
    out[-1].append(i)
    size += nbytes
  return out


def meta_digest(meta: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def check_manifest(item: str, saved: Mapping[str, Any], restored: Mapping[str, Any]) -> None:
  """Raises CorruptCheckpointError naming the first array of `item` that differs."""
  if set(saved) != set(restored):
    missing = sorted(set(saved) - set(restored))[:3]
    extra = sorted(set(restored) - set(saved))[:3]
    raise CorruptCheckpointError(
      f"{item}: arrays differ from the manifest (missing {missing}, unexpected {extra})."
    )
  for name in sorted(saved):
    want, got = saved[name], restored[name]
    for field in ("shape", "dtype", "digest"):
      if want[field] != got[field]:
        what = "contents" if field == "digest" else field
        raise CorruptCheckpointError(
          f"{item}/{name}: {what} {got[field]} on restore, {want[field]} when saved."
        )


def file_digests(step_dir: str) -> dict[str, list[Any]]:
  """{relative path: [size, sha256]} of every file under a local step directory."""
  out = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, step_dir)
      if rel == FILES_MANIFEST or rel.startswith(f".{FILES_MANIFEST}"):
        continue
      digest = hashlib.sha256()
      with open(full, "rb") as f:
        for chunk in iter(lambda f=f: f.read(1 << 22), b""):
          digest.update(chunk)
      out[rel] = [os.path.getsize(full), digest.hexdigest()]
  return dict(sorted(out.items()))


def damaged_files(step_dir: str | os.PathLike) -> list[str] | None:
  """The files of a local step directory that differ from its integrity_files.json, as
  "path (why)" strings; None when there is no such manifest to compare with."""
  step_dir = os.fspath(step_dir)
  try:
    with open(os.path.join(step_dir, FILES_MANIFEST)) as f:
      saved = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  now = file_digests(step_dir)
  out = []
  for rel, (size, sha) in saved.items():
    if rel not in now:
      out.append(f"{rel} (missing)")
    elif now[rel][0] != size:
      out.append(f"{rel} ({now[rel][0]} bytes, {size} when saved)")
    elif now[rel][1] != sha:
      out.append(f"{rel} (contents changed)")
  out.extend(f"{rel} (not in the manifest)" for rel in now if rel not in saved)
  return out
