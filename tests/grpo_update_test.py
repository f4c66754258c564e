"""Tests of the GRPO update step: sharded = single device, micro-batches = one big batch, learning.

All update steps share a few static settings so the suite compiles `update_step` three times.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from flax import nnx

from es_jax.decode.sampling import Decoding
from es_jax.grpo import update as gt
from es_jax.grpo.loss import grpo_loss, token_logprobs
from es_jax.models import (
  ForwardMode,
  Transformer,
  cast_params,
  forward,
  get_config,
  params,
  positions_from_mask,
)

CONFIG = get_config(
  "tiny-llama", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
)
P, G, T, TARGET = 4, 4, 8, 7  # prompts, generations, completion tokens, the rewarded token
DECODING = Decoding(T, temperature=1.0)
SGD = optax.sgd(0.5)  # plain SGD: a parameter change is exactly −lr × gradient
# Settings of the exactness tests: token_mean is the aggregation that needs weights.
EXACT = gt.UpdateSettings(8, 1, gt.LossSettings(0.2, 0.28, 0.1, "token_mean"))
ADAM = gt.make_optimizer(3e-2)
TRAIN = gt.UpdateSettings(16, 4)


def step(state, batch, ref=None, settings=TRAIN, optimizer=ADAM, *, mesh=None, lower=False, **kw):
  """`update_step` on CONFIG; keyword fields of `UpdateSettings` replace those of `settings`."""
  settings = dataclasses.replace(settings, **kw)
  return gt.update_step(
    state, batch, ref, settings, config=CONFIG, optimizer=optimizer, mesh=mesh, lower=lower
  )


def apply(p, tokens, m):
  return forward(p, tokens, positions_from_mask(m), config=CONFIG, mask=m)[0]


@jax.jit
def full_logp(p, tokens, m):  # [B, S-1], the reference scoring path of es_jax.grpo.loss
  return token_logprobs(apply, p, tokens, m)[0]


def prompts():
  rng = np.random.RandomState(0)
  ids = rng.randint(8, 250, (P, 4)).astype(np.int32)
  mask = np.ones((P, 4), bool)
  mask[0, :2] = mask[2, :1] = False  # left padding
  return np.where(mask, ids, 0), mask


def truncate(batch, lengths):
  """Ends row b's completion after lengths[b] tokens, as an EOS would (pad 0 after it)."""
  keep = np.arange(T)[None, :] < np.asarray(lengths)[:, None]  # [B, T]
  tail = np.concatenate([np.ones((keep.shape[0], batch.tokens.shape[1] - T), bool), keep], 1)
  return batch.replace(
    tokens=jnp.where(tail, batch.tokens, 0),
    mask=batch.mask & tail,
    loss_mask=batch.loss_mask & tail[:, 1:],
    sampler_logp=jnp.where(tail[:, 1:], batch.sampler_logp, 0.0),
  )


@pytest.fixture(scope="module")
def setup():
  # Committed to a device like every later state, so the rollout compiles once for the file.
  params0 = jax.device_put(params(Transformer(CONFIG, rngs=nnx.Rngs(0))), jax.devices()[0])
  ids, mask = prompts()
  completions, batch = gt.rollout(
    params0, ids, mask, config=CONFIG, key=jax.random.key(1), num_generations=G, decoding=DECODING
  )
  batch = truncate(batch, np.random.RandomState(1).randint(1, T + 1, P * G))
  rewards = np.random.RandomState(2).randn(P, G).astype(np.float32)
  batch, _ = gt.with_advantages(batch, rewards)
  return params0, completions, batch


@pytest.fixture(scope="module")
def exact_steps(setup):
  """One update on one device and on 8 devices ('pop' axis), reference = initial params."""
  params0, _, batch = setup
  single = step(gt.init_state(params0, SGD), batch, params0, EXACT, SGD)
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  state = gt.init_state(params0, SGD, mesh=mesh)
  ref = gt.replicate(params0, mesh)
  sharded = step(state, gt.shard_batch(batch, mesh), ref, EXACT, SGD, mesh=mesh)
  return single, sharded


@pytest.mark.slow
def test_rollout_layout_follows_the_shift_convention(setup):
  params0, completions, batch = setup
  ids, mask = prompts()
  S = ids.shape[1] + T
  assert batch.tokens.shape == (P * G, S) and batch.loss_mask.shape == (P * G, S - 1)
  np.testing.assert_array_equal(batch.tokens[::G, :4], ids)  # row p·G is prompt p
  np.testing.assert_array_equal(
    batch.tokens[:, 4:], np.where(batch.mask[:, 4:], completions.tokens, 0)
  )
  assert not np.asarray(batch.loss_mask[:, :3]).any()  # prompt positions never in the loss
  logp_full = full_logp(params0, batch.tokens, batch.mask)  # [B, S-1]
  score = jax.jit(gt.completion_logprobs, static_argnames=("config", "completion_length"))
  logp, _ = score(params0, batch.tokens, batch.mask, config=CONFIG, completion_length=T)
  valid = np.asarray(batch.loss_mask)
  np.testing.assert_allclose(np.asarray(logp)[valid[:, -T:]], np.asarray(logp_full)[valid], 1e-5)
  # The sampler scored the same tokens at the same (shifted) positions.
  np.testing.assert_allclose(
    np.asarray(batch.sampler_logp)[valid], np.asarray(logp_full)[valid], atol=1e-4
  )
  assert np.asarray(batch.sampler_logp)[~valid].sum() == 0.0


def test_sharded_rollout_equals_single_device_rollout(setup):
  params0, completions, _ = setup
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  ids, mask = prompts()
  kw = dict(config=CONFIG, key=jax.random.key(1), num_generations=G, decoding=DECODING)
  sharded, batch = gt.rollout(gt.replicate(params0, mesh), ids, mask, mesh=mesh, **kw)
  assert len(batch.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(sharded.tokens, completions.tokens)


def test_sharded_step_equals_single_device_step(exact_steps):
  (single, m_single), (sharded, m_sharded) = exact_steps
  assert len(sharded.params["embed"].sharding.device_set) == 8
  assert int(single.step) == int(sharded.step) == 2  # 16 rows / mini-batches of 8
  moved = jax.tree.map(
    lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
    single.params,
    params(Transformer(CONFIG, rngs=nnx.Rngs(0))),
  )
  assert max(jax.tree.leaves(moved)) > 1e-3  # the step did something to compare
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  for k in m_single:
    np.testing.assert_allclose(m_single[k], m_sharded[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_micro_batches_and_mini_batches_equal_explicit_gradients(setup, exact_steps):
  """Reference: mini-batch i is rows i::2; its gradient from jax.grad of the whole mini-batch's
  loss over [B, S-1] arrays, with π_old fixed at the rollout params for both steps."""
  params0, _, batch = setup
  (state, metrics), _ = exact_steps
  old = full_logp(params0, batch.tokens, batch.mask)  # [B, S-1]

  def loss(p, rows):
    logp = full_logp(p, batch.tokens[rows], batch.mask[rows])
    return grpo_loss(
      logp, old[rows], old[rows], batch.advantages[rows], batch.loss_mask[rows], EXACT.loss
    )

  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
  p = params0
  for i, rows in enumerate([np.arange(0, 16, 2), np.arange(1, 16, 2)]):
    (value, m), grads = grad_fn(p, rows)
    np.testing.assert_allclose(metrics["loss"][i], value, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["kl"][i], m["kl"], rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(metrics["grad_norm"][i], optax.tree.norm(grads), rtol=1e-5)
    p = jax.tree.map(lambda w, g: w - 0.5 * g, p, grads)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(p), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_on_policy_first_mini_batch_has_ratio_one_and_no_clipping(exact_steps):
  (_, m), _ = exact_steps
  np.testing.assert_allclose(m["ratio_mean"][0], 1.0, atol=1e-6)
  assert m["clip_frac"][0] == 0.0 and abs(float(m["kl"][0])) < 1e-7  # reference = rollout policy
  # The second mini-batch is scored after one update: off-policy, so the metrics can fail.
  assert abs(float(m["ratio_mean"][1]) - 1.0) > 1e-3 and float(m["kl"][1]) > 1e-6


@pytest.mark.slow
def test_beta_zero_needs_no_reference_and_ignores_one(setup):
  params0, _, batch = setup
  a, _ = step(gt.init_state(params0, ADAM), batch, None, loss=gt.LossSettings(beta=0.0))
  b, _ = step(gt.init_state(params0, ADAM), batch, {"not": "params"})
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="beta=0.1 > 0 needs ref_params"):
    step(gt.init_state(params0, ADAM), batch, None, loss=gt.LossSettings(beta=0.1))


@pytest.mark.slow  # a training run's behaviour, no reference
def test_grpo_raises_reward_and_collapses_entropy(setup):
  """Reward: fraction of completion tokens equal to TARGET; baseline ≈ 1/256 at random init."""
  params0, _, _ = setup
  ids, mask = prompts()
  state = gt.init_state(params0, ADAM)
  key = jax.random.key(3)
  rewards, entropies, compiled = [], [], None
  for _ in range(30):
    key, key_sample = jax.random.split(key)
    completions, batch = gt.rollout(
      state.params, ids, mask, config=CONFIG, key=key_sample, num_generations=G, decoding=DECODING
    )
    r = np.mean(np.asarray(completions.tokens) == TARGET, axis=1).reshape(P, G)
    batch, _ = gt.with_advantages(batch, r)
    rewards.append(r.mean())
    entropies.append(float(gt.rollout_stats(completions)["rollout_entropy"]))
    state, metrics = step(state, batch)
    assert np.isfinite(metrics["loss"]).all() and metrics["loss"].shape == (1,)
    # One mini-batch: π_old is the policy being trained (no recomputed forward pass), ratio ≡ 1.
    assert metrics["ratio_mean"][0] == 1.0 and metrics["clip_frac"][0] == 0.0
    compiled = compiled or gt._update_step._cache_size()
    assert gt._update_step._cache_size() == compiled  # no retrace from the second step on
  np.testing.assert_allclose(metrics["learning_rate"], 3e-2)
  start_reward, start_entropy = np.mean(rewards[:3]), np.mean(entropies[:3])
  assert np.mean(rewards[-3:]) > start_reward + 0.5, rewards
  assert np.mean(entropies[-3:]) < start_entropy - 2.0, entropies  # nats, from ≈ log 256


def test_make_optimizer_is_clipped_adamw_with_schedule():
  grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}  # ‖g‖ = 13
  w = {"a": jnp.array([1.0, -1.0]), "b": jnp.array([[2.0]])}
  schedule = optax.linear_schedule(1e-2, 0.0, 10)
  opt = gt.make_optimizer(schedule, weight_decay=0.1, max_grad_norm=1.0, b2=0.99)
  reference = optax.adamw(schedule, b2=0.99, weight_decay=0.1)
  state, ref_state = opt.init(w), reference.init(w)
  for _ in range(3):
    updates, state = opt.update(grads, state, w)
    clipped = jax.tree.map(lambda g: g / 13.0, grads)
    ref_updates, ref_state = reference.update(clipped, ref_state, w)
    for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(ref_updates), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6)
  np.testing.assert_allclose(state.hyperparams["learning_rate"], schedule(2), rtol=1e-6)
  with pytest.raises(ValueError, match="max_grad_norm=-1"):
    gt.make_optimizer(1e-3, max_grad_norm=-1)
  with pytest.raises(ValueError, match="learning_rate=0"):
    gt.make_optimizer(0)


def test_bad_input_raises_naming_the_value(setup):
  params0, _, batch = setup
  ids, mask = prompts()
  kw = dict(config=CONFIG, key=jax.random.key(0), decoding=DECODING)
  with pytest.raises(ValueError, match="num_generations=1"):
    gt.rollout(params0, ids, mask, num_generations=1, **kw)
  with pytest.raises(ValueError, match=r"prompt_mask \(4, 3\)"):
    gt.rollout(params0, ids, mask[:, :3], num_generations=G, **kw)
  with pytest.raises(ValueError, match=r"rewards shape \(4, 3\)"):
    gt.with_advantages(batch, np.zeros((P, 3)))
  state = gt.init_state(params0, ADAM)
  cases = [
    (dict(mini_batch_size=6), "batch rows B=16 is not divisible by mini_batch_size=6"),
    (
      dict(micro_batch_size=3),
      "mini_batch_size=16 is not divisible by micro_batch_size × devices=3",
    ),
  ]
  for override, message in cases:
    with pytest.raises(ValueError, match=message):
      step(state, batch, params0, **override)
  with pytest.raises(ValueError, match=r"batch.advantages has shape \(8,\)"):
    step(state, batch.replace(advantages=batch.advantages[:8]))
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  with pytest.raises(ValueError, match="micro_batch_size × devices=32"):
    step(state, batch, mesh=mesh)
  with pytest.raises(ValueError, match="rows P·G=12 is not divisible by devices on 'pop'=8"):
    gt.rollout(params0, ids[:3], mask[:3], num_generations=G, mesh=mesh, **kw)


def test_update_settings_check_their_fields_and_trace_the_loss_numbers():
  # Checked once, on construction, each error naming its field (a config layer relabels them).
  for fields, message in (
    (dict(mini_batch_size=0), r"UpdateSettings.mini_batch_size=0 "),
    (dict(micro_batch_size=2.0), r"UpdateSettings.micro_batch_size=2.0 "),
    (dict(chunk_size=0), r"UpdateSettings.chunk_size=0 "),
    (dict(loss=None), r"UpdateSettings.loss=None "),
  ):
    with pytest.raises(ValueError, match=message):
      dataclasses.replace(TRAIN, **fields)
  for fields, message in (
    (dict(eps_low=1.0), r"LossSettings.eps_low=1.0 "),
    (dict(eps_high=-0.1), r"LossSettings.eps_high=-0.1 "),
    (dict(beta=-1.0), r"LossSettings.beta=-1.0 "),
    (dict(aggregation="sum"), r"LossSettings.aggregation='sum' "),
  ):
    with pytest.raises(ValueError, match=message):
      dataclasses.replace(TRAIN.loss, **fields)
  # The loss's eps_low, eps_high and beta are the traced leaves (a sweep does not recompile); the
  # rest is the static structure.
  other = dataclasses.replace(TRAIN, loss=gt.LossSettings(eps_low=0.1, eps_high=0.3, beta=0.5))
  assert jax.tree.leaves(other) == [0.1, 0.3, 0.5]
  assert jax.tree.structure(other) == jax.tree.structure(TRAIN)
  assert jax.tree.structure(dataclasses.replace(TRAIN, remat=True)) != jax.tree.structure(TRAIN)
  with pytest.raises(ValueError, match="batch rows B=12 is not divisible by mini_batch_size=16"):
    TRAIN.check_rows(12)
  TRAIN.check_rows(32, devices=4)


def test_update_step_lowers_from_abstract_inputs(setup, exact_steps):
  # The program alone, from shapes and shardings (what a TPU planner compiles): the compiled
  # executable run on real arrays gives the step `update_step` runs.
  params0, _, batch = setup
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)  # noqa: E731
  ref, batch = gt.replicate(params0, mesh), gt.shard_batch(batch, mesh)
  state = gt.abstract_state(jax.tree.map(abstract, ref), SGD)
  assert state.params["embed"].dtype == jnp.float32 and state.step.sharding.mesh == mesh
  batch_a, ref_a = jax.tree.map(abstract, (batch, ref))
  lowered = step(state, batch_a, ref_a, EXACT, SGD, mesh=mesh, lower=True)
  compiled = lowered.compile()
  assert compiled.memory_analysis().temp_size_in_bytes > 0
  new, _ = compiled(gt.init_state(params0, SGD, mesh=mesh), batch, ref, EXACT.as_float32())
  want = exact_steps[1][0].params
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_bf16_model_trains_float32_masters():
  # A bf16 model (the paper's checkpoints): forward/backward in bf16, float32 master weights.
  # With SGD the master update is exactly −lr × the gradient of the bf16 model's loss, applied
  # without rounding; pure-bf16 AdamW (master_dtype=None) keeps bf16 everywhere (the scan carry
  # must not change dtype) and at a small lr leaves most weights where they were.
  cfg = CONFIG.replace(dtype="bfloat16")
  p16 = cast_params(params(Transformer(CONFIG, rngs=nnx.Rngs(3))), jnp.bfloat16)
  ids, mask = prompts()
  key = jax.random.key(4)
  _, batch = gt.rollout(p16, ids, mask, config=cfg, key=key, num_generations=G, decoding=DECODING)
  batch, _ = gt.with_advantages(batch, np.random.RandomState(5).randn(P, G).astype(np.float32))
  rows = dict(mini_batch_size=P * G, micro_batch_size=P * G // 2)
  sgd = optax.sgd(1.0)
  state = gt.init_state(p16, sgd)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
  settings = gt.UpdateSettings(**rows, loss=gt.LossSettings(aggregation="token_mean"))
  new, metrics = gt.update_step(state, batch, None, settings, config=cfg, optimizer=sgd)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new.params))
  assert all(
    x.dtype == jnp.bfloat16 for x in jax.tree.leaves(cast_params(new.params, cfg.jnp_dtype))
  )

  def loss(p):
    length = batch.completion_length
    logp, _ = gt.completion_logprobs(
      p, batch.tokens, batch.mask, config=cfg, completion_length=length
    )
    m = batch.loss_mask[:, -length:]
    old = jax.lax.stop_gradient(logp)
    return grpo_loss(logp, old, None, batch.advantages, m, settings.loss)[0]

  grads = jax.grad(loss)(p16)  # eager bf16: rounding differs from the jitted step by a few ulps
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert scale > 1e-4
  for g, p0, p1 in zip(*map(jax.tree.leaves, (grads, p16, new.params)), strict=True):
    delta = np.asarray(p1) - np.asarray(p0, np.float32)
    np.testing.assert_allclose(delta, -np.asarray(g, np.float32), rtol=0.05, atol=1e-3 * scale)
  # The masters hold the unrounded sum: most updated weights are not bf16 numbers any more.
  flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(new.params)])
  assert np.mean(flat.astype(ml_dtypes.bfloat16).astype(np.float32) != flat) > 0.5

  adam = gt.make_optimizer(1e-5)
  state = gt.init_state(p16, adam, master_dtype=None)
  settings = gt.UpdateSettings(**rows, loss=gt.LossSettings(beta=0.01))
  new, metrics = gt.update_step(state, batch, p16, settings, config=cfg, optimizer=adam)
  assert np.all(np.isfinite(np.asarray(metrics["loss"])))
  arrays = [x for x in jax.tree.leaves((new.params, new.opt_state)) if x.ndim > 0]
  assert all(x.dtype == jnp.bfloat16 for x in arrays)
  pairs = zip(jax.tree.leaves(new.params), jax.tree.leaves(p16), strict=True)
  changed = [np.mean(np.asarray(a) != np.asarray(b)) for a, b in pairs]
  assert 0 < np.mean(changed) < 0.5, changed  # lr 1e-5 steps are mostly below bf16's resolution


@pytest.mark.slow
def test_remat_gives_the_same_step_and_recomputes_layers(setup, exact_steps):
  """Gradient checkpointing changes memory, not the update: same params as the saved-activation
  step, and the backward pass really rematerialises a whole layer (without remat: a layer's
  elementwise ops only, its matrix products saved)."""
  params0, _, batch = setup
  (single, m_single), _ = exact_steps
  remat, m_remat = step(gt.init_state(params0, SGD), batch, params0, EXACT, SGD, remat=True)
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(remat.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m_single["loss"], m_remat["loss"], rtol=1e-5, atol=1e-7)

  def jaxpr(flag):
    def f(p):
      logp, _ = gt.completion_logprobs(
        p, batch.tokens, batch.mask, config=CONFIG, completion_length=T, remat=flag
      )
      return logp.sum()

    return str(jax.make_jaxpr(jax.grad(f))(params0))

  # remat saves nothing of a layer; without it a layer saves its matrix products only.
  assert "policy=None" in jaxpr(True) and "DotsSaveable" not in jaxpr(True)
  assert "DotsSaveable" in jaxpr(False) and "policy=None" not in jaxpr(False)


def test_last_only_n_gives_the_last_n_positions_and_their_gradient(key):
  # GRPO scores the completion's last T + 1 positions: the lm head on those rows only gives the
  # same logits, and the same gradient of a loss on them, as the full [B, S, V] forward.
  cfg = get_config("tiny-llama", dtype="float32")
  p = params(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jax.random.randint(key, (2, 9), 0, cfg.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(9), (2, 9))

  # Jitted: one compile per program instead of one per operation.
  def fwd_(p, n):
    return forward(p, tokens, pos, config=cfg, mode=ForwardMode(last_only=n))[0]

  fwd = jax.jit(fwd_, static_argnums=1)
  full, last = fwd(p, False), fwd(p, 4)
  assert last.shape == (2, 4, cfg.vocab_size)
  np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -4:]), rtol=1e-5, atol=1e-5)
  assert fwd(p, True).shape == (2, 1, cfg.vocab_size)

  def loss(p, n):
    logits = fwd_(p, n)[:, -4:]
    return jnp.sum(jax.nn.log_softmax(logits)[..., 3])

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_full, g_last = grad(p, False), grad(p, 4)
  assert float(jnp.max(jnp.abs(g_full["embed"]))) > 0.0  # the gradient is not trivially zero
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_last), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
