"""Tests for es_jax.persist.checkpoint: bit-exact round trips, keep-N, atomicity, corruption."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from es_jax.persist.checkpoint import (
  Checkpointer,
  CorruptCheckpointError,
  CorruptCheckpointWarning,
)

# Orbax/tensorstore log an "Event loop is closed" from a failed read's cleanup thread.
_FAILED_READ_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _state(key, scale=1.0):
  k1, k2 = jax.random.split(key)
  params = {
    "w": jax.random.normal(k1, (4, 3), jnp.float32) * scale,
    "b": (jax.random.normal(k2, (3,), jnp.float32) * scale).astype(jnp.bfloat16),
  }
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)
  # One real update so mu/nu/count hold non-trivial values.
  grads = jax.tree.map(lambda p: p * 0.5 + 1e-3, params)
  _, opt_state = tx.update(grads, opt_state, params)
  return {"params": params, "opt_state": opt_state}


def _assert_bit_identical(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b, strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(
      np.asarray(x).view(np.uint8 if x.dtype.itemsize == 1 else f"u{x.dtype.itemsize}"),
      np.asarray(y).view(np.uint8 if y.dtype.itemsize == 1 else f"u{y.dtype.itemsize}"),
    )


def _save_steps(directory, key, steps, **kwargs):
  states = {}
  with Checkpointer(directory, max_to_keep=None, **kwargs) as ckpt:
    for s in steps:
      states[s] = _state(jax.random.fold_in(key, s))
      ckpt.save(s, state=states[s], key=jax.random.fold_in(key, 100 + s), meta={"pos": 10 * s})
  return states


def test_round_trip_is_bit_identical(tmp_path, key):
  state = _state(key)
  run_key = jax.random.key(7, impl="rbg")
  with Checkpointer(tmp_path / "ckpt") as ckpt:
    assert ckpt.save(5, state=state, key=run_key, meta={"pos": np.int64(3), "stage": "es"})
    # No wait(): restore must wait for the asynchronous save itself.
    restored = ckpt.restore(
      abstract_state=jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    )
  _assert_bit_identical(restored.state, state)
  assert restored.state["params"]["b"].dtype == jnp.bfloat16
  assert restored.meta == {"pos": 3, "step": 5, "stage": "es"}
  assert jax.dtypes.issubdtype(restored.key.dtype, jax.dtypes.prng_key)
  assert jax.random.key_impl(restored.key) == jax.random.key_impl(run_key)
  np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(run_key))
  # The restored key drives the same random stream as the original.
  np.testing.assert_array_equal(
    jax.random.uniform(restored.key, (4,)), jax.random.uniform(run_key, (4,))
  )


def test_without_key_and_without_abstract_state(tmp_path, key):
  state = _state(key)
  with Checkpointer(tmp_path, async_save=False) as ckpt:
    ckpt.save(1, state=state)
    restored = ckpt.restore()
  assert restored.key is None
  _assert_bit_identical(restored.state["params"], state["params"])


def test_sharded_restore_places_leaves_and_key(tmp_path, key):
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.NamedSharding(mesh, jax.P("pop"))
  state = {"x": jax.device_put(jnp.arange(16, dtype=jnp.float32), sharding)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state=state, key=key)
    restored = ckpt.restore(abstract_state=state)
  assert restored.state["x"].sharding == sharding
  assert restored.key.sharding.mesh == mesh and restored.key.sharding.is_fully_replicated
  np.testing.assert_array_equal(restored.state["x"], np.arange(16))


def test_keeps_newest_and_respects_interval(tmp_path, key):
  state = _state(key)
  with Checkpointer(tmp_path / "a", max_to_keep=2) as ckpt:
    for s in range(1, 5):
      ckpt.save(s, state=state)
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    assert ckpt.latest_step() == 4
    assert not ckpt.save(4, state=state, force=True)  # already on disk: not rewritten
  with Checkpointer(tmp_path / "b", max_to_keep=None, save_interval_steps=3) as ckpt:
    written = [s for s in range(1, 8) if ckpt.save(s, state=state)]
    assert ckpt.save(8, state=state, force=True)
    ckpt.wait()
    # The first save of a manager is always written, then multiples of 3, then the forced one.
    assert written == [1, 3, 6]
    assert ckpt.all_steps() == [1, 3, 6, 8]
    assert ckpt.should_save(9) and not ckpt.should_save(10)


def test_bad_arguments_are_named(tmp_path, key):
  state = _state(key)
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match="meta\\['step'\\]"):
      ckpt.save(2, state=state, meta={"step": 1})
    with pytest.raises(TypeError, match="typed key"):
      ckpt.save(2, state=state, key=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="object"):
      ckpt.save(2, state=state, meta={"x": object()})
    with pytest.raises(FileNotFoundError, match="restore_or_none"):
      ckpt.restore()
    assert ckpt.restore_or_none() is None
    ckpt.save(2, state=state)
    with pytest.raises(FileNotFoundError, match="step 5"):
      ckpt.restore(5)
  with pytest.raises(ValueError, match="max_to_keep"):
    Checkpointer(tmp_path, max_to_keep=0)


def test_uncommitted_tmp_dir_is_ignored(tmp_path, key):
  states = _save_steps(tmp_path, key, [1, 2])
  # A save killed before its rename: a complete-looking step directory under a tmp name.
  shutil.copytree(tmp_path / "2", tmp_path / "3.orbax-checkpoint-tmp-1234567890")
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 2
    restored = ckpt.restore_or_none(abstract_state=states[2])
    assert restored.meta["step"] == 2
    # Step 3 can then be saved for real.
    assert ckpt.save(3, state=states[2], force=True)
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2, 3]


def _truncate_data(step_dir):
  files = sorted((step_dir / "state" / "d").iterdir())
  assert files, f"no data files under {step_dir}"
  for f in files:
    os.truncate(f, f.stat().st_size // 2)


def _delete_data(step_dir):
  for f in (step_dir / "state" / "d").iterdir():
    f.unlink()


def _delete_commit_marker(step_dir):
  (step_dir / "commit_success.txt").unlink()


@_FAILED_READ_NOISE
@pytest.mark.parametrize("corrupt", [_truncate_data, _delete_data, _delete_commit_marker])
def test_corrupt_latest_falls_back_with_warning(tmp_path, key, corrupt):
  states = _save_steps(tmp_path, key, [1, 2, 3])
  corrupt(tmp_path / "3")
  with Checkpointer(tmp_path) as ckpt:
    with pytest.warns(CorruptCheckpointWarning, match=str(tmp_path / "3")):
      restored = ckpt.restore(abstract_state=states[3])
    assert restored.meta == {"step": 2, "pos": 20}
    _assert_bit_identical(restored.state, states[2])
    np.testing.assert_array_equal(
      jax.random.key_data(restored.key), jax.random.key_data(jax.random.fold_in(key, 102))
    )
    # The unreadable step is moved aside, so the resumed run can write step 3 again.
    assert (tmp_path / "3.corrupt").is_dir() and not (tmp_path / "3").exists()
    assert ckpt.latest_step() == 2
    assert ckpt.save(3, state=states[3], force=True)
    ckpt.wait()
    _assert_bit_identical(ckpt.restore(abstract_state=states[3]).state, states[3])


@_FAILED_READ_NOISE
def test_explicit_corrupt_step_raises_and_mismatch_moves_nothing(tmp_path, key):
  states = _save_steps(tmp_path, key, [1, 2])
  _delete_data(tmp_path / "2")
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(Exception, match="2"):
      ckpt.restore(2, abstract_state=states[2])
    # A target that matches no checkpoint is a caller error: nothing may be moved aside.
    wrong = {"other": jnp.zeros((5,))}
    with pytest.raises(RuntimeError, match="abstract_state"):
      ckpt.restore(abstract_state=wrong)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name[0].isdigit()) == ["1", "2"]


def test_only_checkpoint_uncommitted_means_fresh_start(tmp_path, key):
  states = _save_steps(tmp_path, key, [1])
  _delete_commit_marker(tmp_path / "1")
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() is None
    with pytest.warns(CorruptCheckpointWarning, match=str(tmp_path / "1")):
      assert ckpt.restore_or_none(abstract_state=states[1]) is None
    assert ckpt.save(1, state=states[1])
    ckpt.wait()
    assert ckpt.restore().meta["step"] == 1


def test_relative_directory_is_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  ckpt = Checkpointer("runs/ckpt", async_save=False)
  ckpt.save(1, state={"w": jnp.arange(3.0)})
  np.testing.assert_array_equal(ckpt.restore().state["w"], np.arange(3.0))
  ckpt.close()
  assert (tmp_path / "runs" / "ckpt" / "1").is_dir()


def _big_state(key, step):
  # Large enough that a data file holds more than 8 KiB, so 4 KiB fit into its middle.
  k = jax.random.fold_in(key, step)
  return {"w": jax.random.normal(k, (64, 512), jnp.float32), "n": jnp.arange(8) + step}


def _largest_data_file(step_dir):
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  return max(files, key=lambda p: p.stat().st_size)


def _garbage_in_middle(step_dir):
  f = _largest_data_file(step_dir)
  size = f.stat().st_size
  assert size > 3 * 4096, f"{f} is only {size} bytes"
  with open(f, "r+b") as fh:
    fh.seek(size // 2)
    fh.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  return f


def _flip_one_bit(step_dir):
  f = _largest_data_file(step_dir)
  data = bytearray(f.read_bytes())
  data[len(data) // 2] ^= 0x10
  f.write_bytes(bytes(data))
  return f


def _truncate_largest(step_dir):
  f = _largest_data_file(step_dir)
  os.truncate(f, f.stat().st_size // 2)
  return f


def _delete_largest(step_dir):
  f = _largest_data_file(step_dir)
  f.unlink()
  return f


def _edit_meta(step_dir):
  (step_dir / "meta" / "metadata").write_text('{"step": 3, "pos": 999}')
  return step_dir / "meta" / "metadata"


def _delete_manifest(step_dir):
  shutil.rmtree(step_dir / "integrity")
  return step_dir / "integrity" / "metadata"


@_FAILED_READ_NOISE
@pytest.mark.parametrize(
  "corrupt",
  [
    _garbage_in_middle,
    _flip_one_bit,
    _truncate_largest,
    _delete_largest,
    _edit_meta,
    _delete_manifest,
  ],
)
def test_corruption_in_place_falls_back_bit_for_bit(tmp_path, key, corrupt):
  states = {}
  with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
    for s in (1, 2, 3):
      states[s] = _big_state(key, s)
      ckpt.save(s, state=states[s], key=jax.random.fold_in(key, 100 + s), meta={"pos": 10 * s})
  assert (tmp_path / "3" / "integrity_files.json").exists()
  damaged = corrupt(tmp_path / "3").relative_to(tmp_path / "3")
  with Checkpointer(tmp_path) as ckpt:
    with pytest.warns(CorruptCheckpointWarning, match=str(tmp_path / "3")) as record:
      restored = ckpt.restore(abstract_state=states[3])
    # The warning names the step and the file that changed.
    message = str(record[0].message)
    assert "files changed since the save: " in message and f"{damaged} (" in message
    assert restored.meta == {"step": 2, "pos": 20}
    _assert_bit_identical(restored.state, states[2])
    np.testing.assert_array_equal(
      jax.random.key_data(restored.key), jax.random.key_data(jax.random.fold_in(key, 102))
    )
    assert (tmp_path / "3.corrupt").is_dir() and ckpt.latest_step() == 2


@_FAILED_READ_NOISE
def test_without_manifest_check_a_bit_flip_goes_unnoticed(tmp_path, key):
  # Why the manifest exists: Orbax alone reads the damaged step 3 as if it were intact.
  with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
    for s in (2, 3):
      ckpt.save(s, state=_big_state(key, s))
  flipped = _flip_one_bit(tmp_path / "3").relative_to(tmp_path / "3")
  with Checkpointer(tmp_path, integrity=False) as ckpt:
    unchecked = ckpt.restore(abstract_state=_big_state(key, 3))
  assert unchecked.meta["step"] == 3
  assert not np.array_equal(unchecked.state["w"], _big_state(key, 3)["w"])
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(CorruptCheckpointError, match="state/w: contents") as info:
      ckpt.restore(3, abstract_state=_big_state(key, 3))
  assert info.value.__notes__ == [f"Files changed since the save: {flipped} (contents changed)"]
