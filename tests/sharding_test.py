"""es_jax.sharding: mesh shapes and axis types, parameter shardings (sharded forward equals the
single-device forward), population placement, multi-host detection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from es_jax import sharding
from es_jax.models import ModelConfig, forward, param_shapes, positions_from_mask

CONFIG = ModelConfig(
  vocab_size=32,
  hidden_size=16,
  num_layers=2,
  num_heads=2,
  num_kv_heads=1,
  intermediate_size=32,
  max_position_embeddings=64,
)


def _params(seed=0):
  rng = np.random.RandomState(seed)

  def build(tree):
    return {
      k: build(v)
      if isinstance(v, dict)
      else jnp.asarray(rng.randn(*v) / np.sqrt(v[-2] if len(v) > 1 else 1), jnp.float32)
      for k, v in tree.items()
    }

  return build(param_shapes(CONFIG))


def test_make_mesh_shapes_and_auto_axes():
  mesh = sharding.make_mesh()
  assert mesh.axis_names == ("pop", "model")
  assert dict(mesh.shape) == {"pop": 8, "model": 1}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  assert dict(sharding.make_mesh(model=2).shape) == {"pop": 4, "model": 2}
  one = sharding.make_mesh(pop=1)
  assert one.devices.size == 1 and one.devices.flat[0] == jax.devices()[0]


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(pop=8, model=2), "16 devices"),
    (dict(model=3), "model=3 does not divide"),
    (dict(pop=0), "pop=0"),
    (dict(model=0), "model=0"),
  ],
)
def test_make_mesh_bad_sizes(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(**kwargs)


def test_leaf_spec_rules():
  assert sharding.leaf_spec((2, 16, 32), 2, min_size=1) == P(None, None, "model")
  assert sharding.leaf_spec((2, 32, 16), 2, min_size=1) == P(None, "model", None)
  assert sharding.leaf_spec((2, 33, 15), 2, min_size=1) == P()  # nothing divisible
  assert sharding.leaf_spec((16,), 2, min_size=1) == P()  # vectors stay whole
  assert sharding.leaf_spec((2, 16, 32), 2) == P()  # below min_size
  assert sharding.leaf_spec((2, 16, 32), 1, min_size=1) == P()  # model axis of size 1


def test_param_shardings_replicate_by_default_and_split_over_model():
  params = _params()
  specs = jax.tree.map(lambda s: s.spec, sharding.param_shardings(params, sharding.make_mesh()))
  assert all(s == P() for s in jax.tree.leaves(specs))
  mesh = sharding.make_mesh(pop=4, model=2)
  specs = jax.tree.map(lambda s: s.spec, sharding.param_shardings(params, mesh, min_size=256))
  assert specs["layers"]["w_gate"] == P(None, None, "model")  # [L, 16, 32]
  assert specs["layers"]["w_down"] == P(None, "model", None)  # [L, 32, 16]
  assert specs["embed"] == P("model", None)  # [32, 16]
  assert specs["final_norm"] == P() and specs["layers"]["attn_norm"] == P()  # small


def test_model_sharded_forward_equals_single_device():
  params = _params()
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, CONFIG.vocab_size, (8, 6)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[1, :2] = False

  @jax.jit
  def logits(p, tokens, mask):
    return forward(p, tokens, positions_from_mask(mask), config=CONFIG, mask=mask)[0]

  ref = np.asarray(logits(params, tokens, mask))
  mesh = sharding.make_mesh(pop=4, model=2)
  sharded = sharding.shard_params(params, mesh, min_size=1)
  assert sharded["layers"]["wq"].sharding.spec == P(None, "model", None)
  assert len(sharded["layers"]["wq"].addressable_shards[0].data.shape) == 3
  assert sharded["layers"]["wq"].addressable_shards[0].data.shape[1] == CONFIG.hidden_size // 2
  batch = sharding.shard_population((tokens, mask), mesh)
  out = logits(sharded, *batch)
  assert out.sharding.spec[0] == "pop"
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)


def test_shard_population_splits_leading_axis():
  mesh = sharding.make_mesh()
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  y = sharding.shard_population(x, mesh)
  assert y.sharding.spec == P("pop", None)
  assert [s.data.shape for s in y.addressable_shards] == [(1, 3)] * 8
  np.testing.assert_array_equal(np.asarray(y), x)
  np.testing.assert_array_equal(np.asarray(sharding.shard_population(jnp.asarray(x), mesh)), x)
  with pytest.raises(ValueError, match="leading axis size=6 is not divisible"):
    sharding.shard_population(np.zeros((6, 3)), mesh)


def test_initialize_distributed_is_a_noop_on_one_host(monkeypatch):
  for var in (
    "JAX_COORDINATOR_ADDRESS",
    "COORDINATOR_ADDRESS",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "TPU_WORKER_HOSTNAMES",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
  ):
    monkeypatch.delenv(var, raising=False)
  assert sharding.initialize_distributed() is False
  assert jax.process_count() == 1


@pytest.mark.parametrize(
  "env, expected",
  [
    ({}, False),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, False),
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"}, True),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ({"SLURM_NTASKS": "1"}, False),
    ({"SLURM_NTASKS": "4"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "x"}, False),
  ],
)
def test_multi_process_env_detection(env, expected):
  assert sharding._multi_process_env(env) is expected


def test_place_params_keeps_placed_leaves_and_local_rows():
  mesh = sharding.make_mesh(pop=4, model=2)
  params = _params()
  split = sharding.shard_params(params, mesh, min_size=1)
  mixed = dict(split, final_norm=params["final_norm"])  # one leaf not yet on the mesh
  placed = sharding.place_params(mixed, mesh)
  assert placed["layers"]["wq"] is split["layers"]["wq"]
  assert placed["final_norm"].sharding.spec == P()
  x = sharding.shard_population(np.arange(16, dtype=np.int32).reshape(8, 2), mesh)
  rows, values = sharding.local_rows(x)
  np.testing.assert_array_equal(rows, np.arange(8))
  np.testing.assert_array_equal(values, np.arange(16).reshape(8, 2))
