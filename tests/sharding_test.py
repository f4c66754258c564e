"""es_jax.devices.sharding: mesh shapes and axis types, parameter shardings (sharded forward equals
the single-device forward), population placement, multi-host detection."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tiny_models import micro_config, random_params

from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.es import gradient as es
from es_jax.es import noise, population
from es_jax.grpo import update as grpo_update
from es_jax.models import forward, positions_from_mask


def _shard_population(tree, mesh):
  """Every array of ``tree`` with its leading axis split over ``'pop'`` (one host's values)."""
  pop = mesh.shape["pop"]

  def put(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    if x.shape[0] % pop:
      raise ValueError(
        f"leading axis size={x.shape[0]} is not divisible by the mesh's 'pop' axis ({pop} devices)"
      )
    spec = NamedSharding(mesh, P("pop", *([None] * (x.ndim - 1))))
    if isinstance(x, jax.Array):
      return jax.device_put(x, spec)
    return jax.make_array_from_callback(x.shape, spec, lambda idx: x[idx])

  return jax.tree.map(put, tree)


CONFIG = micro_config()


def _params(seed=0):
  return random_params(CONFIG, seed, norms="scaled")


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
  batch = _shard_population((tokens, mask), mesh)
  out = logits(sharded, *batch)
  assert out.sharding.spec[0] == "pop"
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)


def test_shard_population_splits_leading_axis():
  mesh = sharding.make_mesh()
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  y = _shard_population(x, mesh)
  assert y.sharding.spec == P("pop", None)
  assert [s.data.shape for s in y.addressable_shards] == [(1, 3)] * 8
  np.testing.assert_array_equal(np.asarray(y), x)
  np.testing.assert_array_equal(np.asarray(_shard_population(jnp.asarray(x), mesh)), x)
  with pytest.raises(ValueError, match="leading axis size=6 is not divisible"):
    _shard_population(np.zeros((6, 3)), mesh)


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
  x = _shard_population(np.arange(16, dtype=np.int32).reshape(8, 2), mesh)
  rows, values = sharding.local_rows(x)
  np.testing.assert_array_equal(rows, np.arange(8))
  np.testing.assert_array_equal(values, np.arange(16).reshape(8, 2))


# --- ES and GRPO steps with the parameters split over 'model' -----------------------------------

# The embedding and head (4100 x 16 = 65600 entries) span two noise blocks, the second one
# shifted back: the update's flattened blocks and a shard's layout really differ.
STEP_CONFIG = micro_config(
  vocab_size=4100,
  hidden_size=16,
  num_layers=1,
  num_heads=2,
  num_kv_heads=2,
  intermediate_size=48,
  max_position_embeddings=32,
)  # no shard of one leaf has the shape or size of another whole leaf (the HLO check below)
N, SIGMA, ALPHA = 8, 0.1, 0.5


def _step_params(config, seed=0):
  return random_params(config, seed)


def _low_half(tokens, mask, vocab_size=CONFIG.vocab_size):
  """A reward that is a deterministic function of the generated tokens: the fraction in the lower
  half of the vocabulary."""
  return ((tokens < vocab_size // 2) & mask).sum(-1) / np.maximum(mask.sum(-1), 1)


def _low_tokens(tokens, mask):
  return _low_half(tokens, mask, STEP_CONFIG.vocab_size)


def _es_step(params, mesh, rank, *, min_size=256):
  """One ES step as experiments/runners/es_runner.py takes it: evaluate, then es_gradient + sgd
  (jitted)."""
  sharded = mesh.shape["model"] > 1
  params = sharding.shard_params(params, mesh, min_size=min_size)
  rng = np.random.RandomState(3)
  ids = rng.randint(0, STEP_CONFIG.vocab_size, (2, 4)).astype(np.int32)
  step_key = jax.random.key(5)
  spec = noise.NoiseSpec(N, rank=rank)
  fitness, stats = population.evaluate_population(
    params,
    ids,
    np.ones_like(ids, bool),
    settings=population.PopulationSettings(spec, SIGMA, STEP_CONFIG, mesh=mesh),
    decoding=sampling.Decoding(2),
    step_key=step_key,
    score_fn=_low_tokens,
  )
  opt = optax.chain(es.es_gradient(spec, sharded=sharded), optax.sgd(ALPHA))

  @jax.jit
  def apply(p, s, f, k):
    updates, s = opt.update(p, s, p, fitness=f, key=k)
    return optax.apply_updates(p, updates)

  new = apply(params, opt.init(params), jnp.asarray(fitness), step_key)
  return params, fitness, stats, new


@pytest.mark.parametrize("rank", [None, 2], ids=["full_rank", "low_rank"])
def test_es_step_model_sharded_equals_pop_only_and_one_device(rank):
  """(pop=4, model=2) = (pop=8, model=1) = one device (low rank: 4x2 = one device), for one
  evaluation + update.

  Fitness and completions are compared exactly (greedy tokens of O(1) logits; a flip would show
  as a different token). The full-rank update is bit-exact: the same noise bits (noise.leaf_normal
  equals the blocks), the same weights and the same member order in every layout. Low rank
  contracts the M·r factors in a matmul whose tiling may follow the output shard, so 1e-6 of the
  weights' scale allows for float32 reassociation of 16 terms, far below the update (> 1e-2).
  """
  params = _step_params(STEP_CONFIG)
  layouts = {"4x2": (4, 2), "8x1": (8, 1), "1x1": (1, 1)}
  if rank is not None:  # low rank against one device only: keeps the suite's time down
    del layouts["8x1"]
  runs = {
    name: _es_step(params, sharding.make_mesh(pop=pop, model=model), rank)
    for name, (pop, model) in layouts.items()
  }
  placed, fitness, stats, new = runs["4x2"]
  specs = [x.sharding.spec for x in jax.tree.leaves(placed)]
  assert sum("model" in s for s in specs) >= 5, specs  # the matrices really are split
  assert new["layers"]["w_up"].sharding.spec == P(None, None, "model")  # and stay split
  assert len(np.unique(fitness)) > 2, fitness  # rewards vary across members
  moved = max(  # in numpy: no eager program per leaf shape and layout
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params), strict=True)
  )
  assert moved > 1e-2, moved
  for name in set(runs) - {"4x2"}:
    _, fit_o, stats_o, new_o = runs[name]
    np.testing.assert_array_equal(fit_o, fitness, err_msg=name)
    np.testing.assert_array_equal(stats_o.completions.tokens, stats.completions.tokens)
    for (path, a), b in zip(
      jax.tree_util.tree_flatten_with_path(new_o)[0], jax.tree.leaves(new), strict=True
    ):
      where = f"{name} {jax.tree_util.keystr(path)}"
      if rank is None:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
      else:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=where)


def _full_gathers_and_arrays(hlo, full_shapes):
  """All-gathers of a compiled (per-device) HLO module whose result is a whole sharded leaf,
  flattened or not, and every float32 array of such a size (a leaf computed unsharded)."""
  sizes = {int(np.prod(s)) for s in full_shapes}

  def is_full(dims):
    shape = tuple(int(d) for d in dims.split(",") if d)
    return shape in full_shapes or (len(shape) == 1 and shape[0] in sizes)

  gathers = [
    m.group(0)[:120]
    for m in re.finditer(r"= (\([^)]*\)|\w+\[[\d,]*\])\S* all-gather\(", hlo)
    if any(is_full(d) for d in re.findall(r"\w+\[([\d,]*)\]", m.group(1)))
  ]
  arrays = sorted({d for d in re.findall(r"f32\[([\d,]*)\]", hlo) if is_full(d)})
  return gathers, arrays


def test_model_sharded_update_and_population_gather_no_parameter():
  """Compiled with the matrices split over 'model', neither the ES update nor the population's
  decode all-gathers a parameter or computes a full-size copy of one; the block-wise update
  (sharded=False) does both, so the check can fail."""
  mesh = sharding.make_mesh(pop=4, model=2)
  params = sharding.shard_params(_step_params(STEP_CONFIG), mesh, min_size=256)
  full = {x.shape for x in jax.tree.leaves(params) if "model" in x.sharding.spec}
  assert (STEP_CONFIG.vocab_size, 16) in full and len(full) >= 4
  f, key = jnp.arange(N, dtype=jnp.float32), jax.random.key(0)

  def update_hlo(sharded):
    opt = optax.chain(es.es_gradient(noise.NoiseSpec(N), sharded=sharded), optax.sgd(ALPHA))
    fn = jax.jit(lambda p, s: optax.apply_updates(p, opt.update(p, s, p, fitness=f, key=key)[0]))
    return fn.lower(params, opt.init(params)).compile().as_text()

  gathers, arrays = _full_gathers_and_arrays(update_hlo(True), full)
  assert not gathers and not arrays, (gathers, arrays)
  gathers, arrays = _full_gathers_and_arrays(update_hlo(False), full)
  assert gathers and arrays  # the flattened blocks: the embedding is gathered

  ids = np.zeros((2, 4), np.int32)
  program = population.population_completions.lower(
    params,
    ids,
    np.ones_like(ids, bool),
    key,
    key,
    sampling.Decoding(2),
    population.PopulationSettings(noise.NoiseSpec(N), jnp.float32(SIGMA), STEP_CONFIG, mesh=mesh),
  )
  hlo = program.compile().as_text()
  assert "all-gather" in hlo  # activations are gathered over 'model' (the parser sees them)
  gathers, arrays = _full_gathers_and_arrays(hlo, full)
  assert not gathers and not arrays, (gathers, arrays)


def test_grpo_step_model_sharded_equals_one_device():
  """grpo_update.init_state + update_step with the params split over 'model' (pop=4 x model=2,
  rows over 'pop') equal the one-device step. Tolerance as tests/grpo_update_test.py: split
  contractions (partial sums over 'model') and split rows reorder float32 sums, ~1e-7 relative."""
  params0 = _params()
  rng = np.random.RandomState(4)
  ids = rng.randint(0, CONFIG.vocab_size, (4, 4)).astype(np.int32)
  mask = np.ones_like(ids, bool)
  decoding = sampling.Decoding(4, temperature=1.0)
  kw = dict(config=CONFIG, key=jax.random.key(2), num_generations=4, decoding=decoding)
  completions, batch = grpo_update.rollout(params0, ids, mask, **kw)
  rewards = _low_half(np.asarray(completions.tokens), np.asarray(completions.mask)).reshape(4, 4)
  assert (rewards.std(axis=1) > 0).sum() >= 2, rewards  # groups with non-zero advantages
  batch, _ = grpo_update.with_advantages(batch, rewards)
  opt = optax.sgd(0.5)
  settings = grpo_update.UpdateSettings(8, 1, grpo_update.LossSettings(beta=0.1))
  step = dict(config=CONFIG, optimizer=opt)
  single, m_single = grpo_update.update_step(
    grpo_update.init_state(params0, opt), batch, params0, settings, **step
  )
  mesh = sharding.make_mesh(pop=4, model=2)
  split = sharding.shard_params(params0, mesh, min_size=256)
  assert split["layers"]["w_up"].sharding.spec == P(None, None, "model")
  state = grpo_update.init_state(split, opt, mesh=mesh)
  sharded, m_sharded = grpo_update.update_step(
    state, grpo_update.shard_batch(batch, mesh), split, settings, mesh=mesh, **step
  )
  assert sharded.params["layers"]["w_up"].sharding.spec[2] == "model"  # still split
  moved = max(
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(params0), strict=True)
  )
  assert moved > 1e-3, moved
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  for k in m_single:
    np.testing.assert_allclose(m_single[k], m_sharded[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_explicit_launch_reads_process_count_and_id():
  env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
  assert sharding.explicit_launch(env) == {"num_processes": 2, "process_id": 1}
  assert sharding.explicit_launch({}) == {}
  with pytest.raises(ValueError, match="JAX_PROCESS_ID='one'"):
    sharding.explicit_launch({"JAX_PROCESS_ID": "one"})


def test_gather_rows_orders_rows_and_names_missing_ones():
  values = np.arange(6, dtype=np.float32).reshape(3, 2)
  out = sharding.gather_rows(np.array([2, 0, 1]), values, 3)
  np.testing.assert_array_equal(out, values[[1, 2, 0]])
  with pytest.raises(ValueError, match=r"rows \[3\] of 4 are missing"):
    sharding.gather_rows(np.array([2, 0, 1]), values, 4)
  assert sharding.is_primary()
  sharding.sync_hosts("one host: no barrier")
  tree = {"a": values}
  assert sharding.fetch(tree) is tree
