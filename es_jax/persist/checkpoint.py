"""Checkpoints of a training run: an Orbax `CheckpointManager` wrapper with integrity checks.

One checkpoint holds three items, each in its own subdirectory of `<directory>/<step>/`:

  state/  any pytree of arrays (params, optimizer state, ...), `ocp.args.StandardSave`;
  key/    the run key's data, optional, with its PRNG implementation in key_impl/ (Orbax's
          `JaxRandomKeySave` re-wraps with the default implementation: "rbg" keys broke);
  meta/   a JSON object: the step plus what the caller adds (data position, stage, ...).

Saves are atomic: Orbax writes `<step>.orbax-checkpoint-tmp-<ts>/` and renames it on commit (on
gs:// it writes `commit_success.txt` last instead), so a run killed mid-save leaves nothing that
`latest_step` or `restore` will pick up. Saves are asynchronous by default: arrays are copied to
host memory before `save` returns, and the files are written in the background; `wait()` blocks.

Every checkpoint also holds an integrity manifest, integrity/: for each array of the state and
the key its shape, dtype and a 64-bit digest of its bytes, and a SHA-256 of the meta JSON. The
digests are computed on device from the arrays being saved, before Orbax copies them, and the
manifest is one more item of the same atomic save, so it commits with the checkpoint. `restore`
recomputes the digests of what it read; a checkpoint whose manifest is missing, unreadable or
disagrees with what was read (bytes changed in place, a bit flip) is not trusted. On a local
file system, process 0 also writes `<step>/integrity_files.json` (the size and SHA-256 of every
file of the step) once the step has committed, at the next `save`, `wait` or `close`; when a step
fails to restore, the warning names the files that no longer match it.

`restore()` with no step tries the newest checkpoint first. A checkpoint that cannot be read or
fails its integrity check (a file changed, truncated or missing, its commit marker missing) is
skipped with a `CorruptCheckpointWarning` naming its path; once an older one restores, the
unreadable newer ones are moved aside to `<step>.corrupt` so that the resumed run can save those
steps again. Paths may be local or gs:// (anything `etils.epath` opens), passed through to Orbax.
Stopping a run on SIGTERM (save, then exit 0) is `es_jax.persist.preemption`.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from es_jax.persist import integrity
from es_jax.persist.integrity import CorruptCheckpointError

_log = logging.getLogger(__name__)

_COMMIT_MARKER = "commit_success.txt"  # written last by Orbax 0.12 on every file system


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint could not be restored and an older one was used instead."""


class NoCheckpointError(FileNotFoundError):
  """The checkpoint directory holds no committed checkpoint."""


class _UncommittedError(FileNotFoundError):  # a step directory without its commit marker
  pass


class Restored(NamedTuple):
  """A restored checkpoint; `meta["step"]` is its step, `key` None if saved without one."""

  state: Any
  key: jax.Array | None
  meta: dict[str, Any]


def _json_default(x: Any) -> Any:
  if isinstance(x, np.generic | np.ndarray | jax.Array) and np.ndim(x) == 0:
    return np.asarray(x).item()
  raise TypeError(
    f"Checkpoint meta: {type(x).__name__} value {x!r} is not JSON serialisable; pass ints, "
    "floats, strings, bools, lists and dicts (scalars from numpy/jax are converted)."
  )


def _abstract_leaf(x: Any, default_sharding: jax.sharding.Sharding) -> Any:
  """An array or ShapeDtypeStruct as a ShapeDtypeStruct with a sharding; other leaves as is."""
  if not isinstance(x, jax.Array | jax.ShapeDtypeStruct | np.ndarray):
    return x
  sharding = None if isinstance(x, np.ndarray) else x.sharding
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or default_sharding)


def _key_sharding_like(abstract_state: Any) -> jax.sharding.Sharding:
  """Replicated over the mesh of the first NamedSharding leaf, else the first device."""
  for leaf in jax.tree.leaves(abstract_state):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _savable_key_data(key: jax.Array, state: Any) -> jax.Array:
  """The key's data; on several hosts a host-local key is laid out as the restore expects it
  (`_key_sharding_like`), since Orbax writes only global arrays there."""
  data = jax.random.key_data(key)
  if jax.process_count() == 1 or not data.is_fully_addressable:
    return data
  host = np.asarray(data)
  return jax.make_array_from_callback(host.shape, _key_sharding_like(state), lambda i: host[i])


class Checkpointer:
  """Saves and restores (state, key, meta) checkpoints of a run, keeping the newest few.

  Example:
    ckpt = Checkpointer(workdir + "/checkpoints", max_to_keep=3, save_interval_steps=10)
    restored = ckpt.restore_or_none(abstract_state=state)
    start = 0 if restored is None else restored.meta["step"]
    ...
    ckpt.save(step, state=state, key=key, meta={"data_position": pos})  # every step; keeps 1/10
    ckpt.save(num_steps, state=state, key=key, force=True)              # at the end
    ckpt.close()
  """

  def __init__(
    self,
    directory: str | epath.PathLike,
    *,
    max_to_keep: int | None = 3,
    save_interval_steps: int = 1,
    async_save: bool = True,
    integrity: bool = True,
  ):
    """Opens (and creates) a checkpoint directory.

    Args:
      directory: local or gs:// directory holding one subdirectory per step.
      max_to_keep: newest checkpoints kept on disk; None keeps all.
      save_interval_steps: `save` writes only steps that are multiples of this (the first save
        of a process and `force=True` saves always write).
      async_save: write files in a background thread; False blocks in `save` until committed.
      integrity: write an integrity manifest with every checkpoint and trust only checkpoints
        whose manifest matches what `restore` read. False neither writes nor checks one (for
        checkpoints written without).
    """
    for name, value in (
      ("max_to_keep", 1 if max_to_keep is None else max_to_keep),
      ("save_interval_steps", save_interval_steps),
    ):
      if value < 1:
        raise ValueError(f"Checkpointer: {name} must be >= 1, got {value}.")
    if "://" not in str(directory):
      directory = os.path.abspath(directory)  # Orbax refuses relative paths
    self.directory = epath.Path(directory)
    self.integrity = integrity
    self._local = "://" not in str(directory)
    self._unlisted: list[int] = []  # saved steps without integrity_files.json yet
    # cleanup_tmp_directories: leftovers of saves killed mid-write are deleted on start.
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=save_interval_steps,
      preservation_policy=ocp.checkpoint_managers.LatestN(n=max_to_keep),
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True,
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` without `force` would write a checkpoint."""
    return self._manager.should_save(step)

  def save(
    self,
    step: int,
    *,
    state: Any,
    key: jax.Array | None = None,
    meta: Mapping[str, Any] | None = None,
    force: bool = False,
  ) -> bool:
    """Saves a checkpoint for `step` if the save interval (or `force`) says so.

    A step already on disk is not written again (for example the final step of a run that is
    resumed after it finished). Returns as soon as the arrays are copied to host memory when
    `async_save` is on; do not delete the directory before `wait()`.

    Args:
      step: the number of completed training steps the state corresponds to.
      state: pytree of arrays (params, optimizer state, ...).
      key: the run key, a typed key from `jax.random.key`; None saves no key.
      meta: JSON-serialisable mapping; numpy/jax scalars are converted. The key "step" is
        reserved: it is set to `step`.
      force: save even if `step` is not a multiple of `save_interval_steps`.

    Returns:
      True if a checkpoint was started for this step.
    """
    step = int(step)
    meta = dict(meta or {})
    if meta.setdefault("step", step) != step:
      raise ValueError(
        f"Checkpointer.save: meta['step']={meta['step']!r} differs from step={step}; the "
        "'step' field is set by save, leave it out of meta."
      )
    meta = json.loads(json.dumps(meta, default=_json_default))
    if key is not None and not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      raise TypeError(
        f"Checkpointer.save: key has dtype {key.dtype}; pass a typed key from jax.random.key "
        "(or wrap raw key data with jax.random.wrap_key_data)."
      )
    if step in self._manager.all_steps() or not (force or self._manager.should_save(step)):
      return False
    items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
    if key is not None:
      data = _savable_key_data(key, state)
      items["key"] = ocp.args.StandardSave({"data": data})
      impl = {"impl": str(jax.random.key_impl(key)), "shape": list(data.shape)}
      items["key_impl"] = ocp.args.JsonSave(impl)
    if self.integrity:
      # Digests of the arrays as they are now, before the (possibly donated) state moves on.
      manifest = {
        "version": integrity.MANIFEST_VERSION,
        "digest": integrity.DIGEST,
        "state": integrity.tree_manifest(state),
        "key": None if key is None else integrity.tree_manifest({"data": data}),
        "meta": integrity.meta_digest(meta),
        "key_impl": impl if key is not None else None,
      }
      items["integrity"] = ocp.args.JsonSave(manifest)
    self._list_committed()
    started = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    if started and self.integrity:
      self._unlisted.append(step)
    return started

  def _list_committed(self) -> None:
    """Waits for pending saves, then writes integrity_files.json into each newly saved step."""
    if not self._unlisted:
      return
    self._manager.wait_until_finished()
    steps, self._unlisted = self._unlisted, []
    if not self._local or jax.process_index() != 0:
      return
    for step in steps:
      path = os.fspath(self._step_path(step))
      if not os.path.exists(os.path.join(path, _COMMIT_MARKER)):
        continue  # deleted by the keep-N policy meanwhile, or never committed
      try:
        tmp = os.path.join(path, f".{integrity.FILES_MANIFEST}.tmp")
        with open(tmp, "w") as f:
          json.dump(
            {"version": integrity.MANIFEST_VERSION, "files": integrity.file_digests(path)}, f
          )
        os.replace(tmp, os.path.join(path, integrity.FILES_MANIFEST))
      except OSError as err:  # optional: the array manifest is what restores trust
        _log.warning("Could not write %s/%s: %s", path, integrity.FILES_MANIFEST, err)

  def wait(self) -> None:
    """Blocks until every started save is committed to disk."""
    self._manager.wait_until_finished()
    self._list_committed()

  def close(self) -> None:
    """Waits for pending saves and releases the manager's threads."""
    self._list_committed()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _step_path(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def all_steps(self) -> list[int]:
    """Committed steps on disk, oldest first (re-read from the directory)."""
    self._manager.reload()
    return sorted(
      s for s in self._manager.all_steps() if (self._step_path(s) / _COMMIT_MARKER).exists()
    )

  def latest_step(self) -> int | None:
    """The newest committed step on disk, or None. Its files are checked only by `restore`."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def latest_meta(self) -> dict[str, Any] | None:
    """The `meta` dict of the newest committed step (its JSON alone, no array read), or None."""
    step = self.latest_step()
    if step is None:
      return None
    info = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(info.meta)

  def _restore_step(self, step: int, abstract_state: Any, key_sharding: Any) -> Restored:
    path = self._step_path(step)
    if not (path / _COMMIT_MARKER).exists():
      raise _UncommittedError(f"{path / _COMMIT_MARKER} is missing: the save never committed.")
    has_key = (path / "key").exists()
    # JSON first: it holds the step to check and the key's implementation and shape.
    json_items = {"meta": ocp.args.JsonRestore()}
    if has_key:
      json_items["key_impl"] = ocp.args.JsonRestore()
    if self.integrity:
      if not (path / "integrity").exists():
        raise CorruptCheckpointError(
          f"{path} has no integrity manifest (integrity/), so its contents cannot be checked; "
          "restore it with Checkpointer(..., integrity=False) if it was written without one."
        )
      json_items["integrity"] = ocp.args.JsonRestore()
    info = self._manager.restore(step, args=ocp.args.Composite(**json_items))
    meta = dict(info.meta)
    manifest = info.integrity if self.integrity else None
    if manifest is not None:
      if not isinstance(manifest, dict) or manifest.get("version") != integrity.MANIFEST_VERSION:
        raise CorruptCheckpointError(f"{path}/integrity: not a version-1 manifest.")
      if manifest.get("meta") != integrity.meta_digest(meta):
        raise CorruptCheckpointError(f"{path}/meta: contents differ from the manifest.")
      if (manifest.get("key") is not None) != has_key:
        raise CorruptCheckpointError(f"{path}/key: present={has_key} disagrees with the manifest.")
      if has_key and manifest.get("key_impl") != dict(info.key_impl):
        raise CorruptCheckpointError(f"{path}/key_impl: contents differ from the manifest.")
    if meta.get("step") != step:
      raise ValueError(f"{path}/meta says step {meta.get('step')!r}, expected {step}.")
    if abstract_state is None:
      items = {"state": ocp.args.StandardRestore()}
    else:
      default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      target = jax.tree.map(lambda x: _abstract_leaf(x, default), abstract_state)
      items = {"state": ocp.args.StandardRestore(target)}
    if has_key:
      sharding = key_sharding or _key_sharding_like(abstract_state)
      shape = tuple(info.key_impl["shape"])
      data = jax.ShapeDtypeStruct(shape, np.uint32, sharding=sharding)
      items["key"] = ocp.args.StandardRestore({"data": data})
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    key = None
    if manifest is not None:
      integrity.check_manifest(
        f"{path}/state", manifest["state"], integrity.tree_manifest(out.state)
      )
      if has_key:
        integrity.check_manifest(f"{path}/key", manifest["key"], integrity.tree_manifest(out.key))
    if has_key:
      key = jax.random.wrap_key_data(out.key["data"], impl=info.key_impl["impl"])
    return Restored(state=out.state, key=key, meta=meta)

  def _quarantine(self, step: int) -> epath.Path:
    """Renames an unreadable step directory to `<step>.corrupt[.n]`, out of Orbax's sight."""
    src = self._step_path(step)
    dst = self.directory / f"{step}.corrupt"
    n = 0
    while dst.exists():
      n += 1
      dst = self.directory / f"{step}.corrupt.{n}"
    if jax.process_index() == 0:
      src.rename(dst)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"es_jax_checkpoint_quarantine_{step}")
    self._manager.reload()
    return dst

  def restore(
    self,
    step: int | None = None,
    *,
    abstract_state: Any = None,
    key_sharding: jax.sharding.Sharding | None = None,
  ) -> Restored:
    """Restores a checkpoint, bit for bit.

    Args:
      step: the step to restore; None restores the newest readable checkpoint, skipping (with a
        `CorruptCheckpointWarning` naming each path) newer ones that fail to restore. An explicit
        step that fails raises instead.
      abstract_state: pytree like the saved state whose leaves are arrays or
        `jax.ShapeDtypeStruct`s giving shape, dtype and sharding of the result (leaves without a
        sharding go to the first device). None restores the saved structure as saved.
      key_sharding: where to put the key; default: replicated on the mesh of the first
        NamedSharding leaf of `abstract_state`, else on the first device.

    Returns:
      `Restored(state, key, meta)`.

    Raises:
      NoCheckpointError: no committed checkpoint in the directory.
      FileNotFoundError: no checkpoint for `step`.
      RuntimeError: every checkpoint failed to restore (nothing is moved aside then; the usual
        cause is an `abstract_state` that does not match what was saved).
    """
    self.wait()
    if step is not None:
      if int(step) not in self.all_steps():
        raise FileNotFoundError(
          f"No committed checkpoint for step {step} in {self.directory}; committed steps: "
          f"{self.all_steps()}."
        )
      try:
        return self._restore_step(int(step), abstract_state, key_sharding)
      except Exception as err:
        damaged = integrity.damaged_files(self._step_path(int(step))) if self._local else None
        if damaged:
          err.add_note(f"Files changed since the save: {', '.join(damaged[:5])}")
        raise
    restored, failures = None, []
    # Newest first, uncommitted directories included so that they get moved aside too.
    for candidate in sorted(self._manager.all_steps(), reverse=True):
      try:
        restored = self._restore_step(candidate, abstract_state, key_sharding)
        break
      except Exception as err:  # noqa: BLE001 - any read error means "try the previous one"
        failures.append((candidate, err))
        _log.warning("Could not restore %s: %s", self._step_path(candidate), err)
    for bad, err in failures:
      # A step that failed to read is known corrupt only once an older one restored with the
      # same target; an uncommitted one always is.
      if restored is None and not isinstance(err, _UncommittedError):
        continue
      bad_path = self._step_path(bad)
      damaged = integrity.damaged_files(bad_path) if self._local else None
      files = f"; files changed since the save: {', '.join(damaged[:5])}" if damaged else ""
      moved_to = self._quarantine(bad)
      instead = f"restored step {restored.meta['step']}" if restored else "none is left"
      warnings.warn(
        f"Checkpoint {bad_path} could not be restored ({type(err).__name__}: "
        f"{str(err)[:300]}){files}; {instead}; moved it to {moved_to}.",
        CorruptCheckpointWarning,
        stacklevel=2,
      )
    if restored is not None:
      return restored
    if all(isinstance(err, _UncommittedError) for _, err in failures):
      raise NoCheckpointError(
        f"No committed checkpoint in {self.directory}; use restore_or_none to start fresh."
      )
    details = "; ".join(
      f"{self._step_path(s)}: {type(e).__name__}: {str(e)[:200]}" for s, e in failures
    )
    raise RuntimeError(
      f"No checkpoint in {self.directory} could be restored ({details}). Check that "
      "abstract_state matches the saved state, or move the directory away to start fresh."
    )

  def restore_or_none(self, **kwargs: Any) -> Restored | None:
    """`restore(**kwargs)` of the newest readable checkpoint, or None when there is none."""
    try:
      return self.restore(**kwargs)
    except NoCheckpointError:
      return None
