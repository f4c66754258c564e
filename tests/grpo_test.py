"""Tests for es_jax.grpo.loss: advantages, the clipped surrogate loss, k3 KL and token log-probs."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from es_jax.grpo import loss as grpo

# Tests call jitted wrappers (one compile per shape instead of one per eager op) and draw their
# data with numpy, so the file stays fast on a busy 2-core machine. beta is traced under these
# wrappers, so cases without a reference leave it at its Python default.
grpo_loss = jax.jit(grpo.grpo_loss, static_argnames=("settings", "max_length"))
group_advantages = jax.jit(grpo.group_advantages, static_argnames="std")
S = grpo.LossSettings
logprobs = jax.jit(grpo.token_logprobs_from_logits, static_argnames="chunk_size")


def _rng(seed=0):
  return np.random.default_rng(seed)


def _log_softmax(x):
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# Group 0 has spread, group 1 is all-equal (0.1 is not exact in float32), group 2 is one-of-four.
REWARDS = np.array([[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1], [1.0, 0.0, 0.0, 0.0]], np.float32)
CENTRED = np.array([[0.5, -0.5, -0.5, 0.5], [0.0] * 4, [0.75, -0.25, -0.25, -0.25]])


@pytest.mark.parametrize(
  "std, eps, group_stds",
  [
    ("population", 1e-4, (0.5, math.sqrt(3) / 4)),  # sqrt(Σc² / 4): Σc² = 1 and 3/4
    ("unbiased", 1e-4, (math.sqrt(1 / 3), 0.5)),  # sqrt(Σc² / 3)
    ("unbiased", 0.0, (math.sqrt(1 / 3), 0.5)),
    (None, 1e-4, (1.0, 1.0)),  # Dr.GRPO: centred rewards, eps unused
  ],
)
def test_group_advantages_golden(std, eps, group_stds):
  advantages, stats = group_advantages(REWARDS, std=std, eps=eps)
  assert advantages.dtype == jnp.float32 and advantages.shape == (3, 4)
  eps_used = 0.0 if std is None else eps
  np.testing.assert_allclose(advantages[0], CENTRED[0] / (group_stds[0] + eps_used), rtol=1e-6)
  np.testing.assert_allclose(advantages[2], CENTRED[2] / (group_stds[1] + eps_used), rtol=1e-6)
  assert np.all(np.asarray(advantages[1]) == 0.0)  # exactly zero, not rounding / eps
  np.testing.assert_allclose(stats["frac_reward_zero_std"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(stats["reward_mean"], 3.4 / 12, rtol=1e-6)


def test_group_advantages_equal_groups_with_rounding_mean_are_zero():
  # The float32 mean of equal values like 3 × 0.7 need not equal 0.7: (r − mean) alone is not 0.
  rewards = (0.7 * np.arange(1, 6, dtype=np.float32)[:, None] * np.ones((1, 3))).astype(np.float32)
  for std in grpo.STD_MODES:
    advantages, stats = group_advantages(rewards, std=std, eps=0.0)
    assert np.all(np.asarray(advantages) == 0.0)
    assert float(stats["frac_reward_zero_std"]) == 1.0


def test_group_advantages_zero_mean_unit_std_per_group():
  rewards = _rng().normal(1.0, 3.0, (6, 8)).astype(np.float32)
  advantages, _ = group_advantages(rewards, std="population", eps=0.0)
  np.testing.assert_allclose(advantages.mean(axis=1), 0.0, atol=1e-6)
  np.testing.assert_allclose(advantages.std(axis=1), 1.0, rtol=1e-5)


def test_group_advantages_errors():
  with pytest.raises(ValueError, match="G=1"):
    grpo.group_advantages(np.ones((4, 1)))
  with pytest.raises(ValueError, match=r"\(8,\)"):
    grpo.group_advantages(np.ones((8,)))
  with pytest.raises(ValueError, match="'bessel'"):
    grpo.group_advantages(np.ones((2, 4)), std="bessel")
  with pytest.raises(ValueError, match="eps=-0.1"):
    grpo.group_advantages(np.ones((2, 4)), eps=-0.1)


@pytest.mark.parametrize(
  "aggregation, max_length, expected",
  [  # Â = [1, −3]; row 0 has 2 valid tokens, row 1 has 1, T = 3; on-policy ℓ = −Â.
    ("seq_mean_token_mean", None, (-1.0 + 3.0) / 2),  # row means −1 and 3, then batch mean
    ("token_mean", None, (-1.0 - 1.0 + 3.0) / 3),
    ("dr_grpo", None, (-1.0 - 1.0 + 3.0) / (2 * 3)),
    ("dr_grpo", 8, (-1.0 - 1.0 + 3.0) / (2 * 8)),
  ],
)
def test_grpo_loss_on_policy_golden(aggregation, max_length, expected):
  logp = np.log(np.array([[0.5, 0.25, 0.9], [0.1, 0.3, 0.3]], np.float32))
  mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  loss, metrics = grpo_loss(
    logp, logp, None, np.array([1.0, -3.0]), mask, S(aggregation=aggregation), max_length=max_length
  )
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  np.testing.assert_allclose(metrics["pg_loss"], expected, rtol=1e-6)
  assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["kl"]) == 0.0
  assert float(metrics["clip_frac"]) == 0.0 and float(metrics["num_tokens"]) == 3.0


def test_grpo_loss_clipping_golden():
  # log ratios ±0.5: ρ = e^{0.5} = 1.6487 (above 1.2), e^{−0.5} = 0.6065 (below 0.8).
  logp = np.array([[0.5, -0.5], [0.5, -0.5]], np.float32)
  hi, lo = math.exp(0.5), math.exp(-0.5)
  per_token = [
    [-1.2, -lo],  # Â = 1: high side clipped to 1.2; low side keeps ρ (pessimistic min)
    [hi, 0.8],  # Â = −1: high side keeps ρ; low side clipped to 0.8
  ]
  loss, metrics = grpo_loss(logp, np.zeros((2, 2)), None, np.array([1.0, -1.0]), np.ones((2, 2)))
  np.testing.assert_allclose(loss, np.mean(per_token), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac_high"], 0.25)
  np.testing.assert_allclose(metrics["clip_frac_low"], 0.25)
  np.testing.assert_allclose(metrics["clip_frac"], 0.5)
  np.testing.assert_allclose(metrics["ratio_mean"], (hi + lo) / 2, rtol=1e-6)
  # Asymmetric (clip-higher): ρ = e^{0.2} = 1.2214 is clipped by eps_high 0.2 but not by 0.28.
  one = (np.array([[0.2]]), np.zeros((1, 1)), None, np.ones(1), np.ones((1, 1)))
  loss_sym, m_sym = grpo_loss(*one)
  loss_asym, m_asym = grpo_loss(*one, S(eps_high=0.28))
  np.testing.assert_allclose(loss_sym, -1.2, rtol=1e-6)
  np.testing.assert_allclose(loss_asym, -math.exp(0.2), rtol=1e-6)
  assert float(m_sym["clip_frac_high"]) == 1.0 and float(m_asym["clip_frac_high"]) == 0.0


def test_grpo_loss_kl_and_entropy_golden():
  # ref − logp = ln 2 gives k3 = 2 − ln 2 − 1; ref = logp gives 0. Padding (col 2) is ignored.
  logp = np.log(np.array([[0.2, 0.4, 0.5], [0.3, 0.3, 0.5]], np.float32))
  ref = logp + np.array([[math.log(2.0), 0.0, 5.0], [0.0, 0.0, 5.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 0]])
  entropy = np.array([[1.0, 2.0, 100.0], [3.0, 4.0, 100.0]])
  k3 = 1.0 - math.log(2.0)
  args = (logp, logp, ref, np.zeros(2), mask)
  loss, metrics = grpo_loss(*args, S(beta=0.1, aggregation="token_mean"), entropy=entropy)
  np.testing.assert_allclose(metrics["kl"], k3 / 4, rtol=1e-6)
  np.testing.assert_allclose(loss, 0.1 * k3 / 4, rtol=1e-6)  # Â = 0: only the KL term remains
  np.testing.assert_allclose(metrics["entropy"], 2.5, rtol=1e-6)
  loss_seq, _ = grpo_loss(*args, S(beta=0.1))
  np.testing.assert_allclose(loss_seq, 0.1 * (k3 / 2 + 0.0) / 2, rtol=1e-6)


def test_grpo_loss_ignores_garbage_padding_and_empty_rows():
  inf, nan = np.inf, np.nan
  logp = np.array([[-1.0, -2.0, -inf], [-inf, nan, -inf]], np.float32)
  old = np.array([[-1.5, -2.0, nan], [nan, 0.0, 0.0]], np.float32)
  ref = np.array([[-1.0, -1.0, inf], [nan, nan, inf]], np.float32)
  mask = np.array([[1, 1, 0], [0, 0, 0]])  # row 1 is empty
  clean = np.where(mask > 0, logp, 0.0)

  @functools.partial(jax.jit, static_argnums=1)
  def value_and_grad(lp, aggregation):
    loss_fn = lambda x: grpo.grpo_loss(
      x, old, ref, jnp.array([2.0, 1.0]), mask, S(beta=0.5, aggregation=aggregation)
    )
    return jax.value_and_grad(loss_fn, has_aux=True)(lp)

  for aggregation in grpo.AGGREGATIONS:
    (loss, metrics), grads = value_and_grad(logp, aggregation)
    (loss_clean, _), grads_clean = value_and_grad(clean, aggregation)
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())
    np.testing.assert_allclose(loss, loss_clean, rtol=1e-6)
    np.testing.assert_allclose(grads, grads_clean, rtol=1e-6)
    assert np.all(np.asarray(grads)[mask == 0] == 0.0)
  # seq_mean_token_mean: the empty row contributes 0 but counts in B = 2.
  (loss, _), _ = value_and_grad(clean, "seq_mean_token_mean")
  loss_row0, _ = grpo_loss(clean[:1], old[:1], ref[:1], np.array([2.0]), mask[:1], S(beta=0.5))
  np.testing.assert_allclose(loss, loss_row0 / 2, rtol=1e-6)


def _aggregation_weights(mask, aggregation, max_length):
  """w[b, t] such that L = Σ w ℓ, written out by hand for the reference gradient."""
  batch = mask.shape[0]
  if aggregation == "seq_mean_token_mean":
    return mask / np.maximum(mask.sum(axis=1, keepdims=True), 1) / batch
  if aggregation == "token_mean":
    return mask / mask.sum()
  return mask / (batch * max_length)


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
def test_on_policy_gradient_equals_reinforce(aggregation):
  rng = _rng(1)
  logp = -rng.uniform(0.1, 3.0, (4, 6)).astype(np.float32)
  ref = (logp + 0.3 * rng.normal(size=(4, 6))).astype(np.float32)
  advantages = rng.normal(size=(4,)).astype(np.float32)
  mask = np.array([[1] * 6, [1] * 3 + [0] * 3, [0] * 6, [1] * 5 + [0]], np.float32)
  w = _aggregation_weights(mask, aggregation, 6)

  def reinforce(lp):  # −Σ_{b,t} w_{b,t} Â_b log π(o_{b,t})
    return -jnp.sum(w * advantages[:, None] * lp)

  @jax.jit
  def grads(lp):  # old_logp = logp itself: on-policy, ρ = 1
    loss = lambda x, beta, r: grpo.grpo_loss(
      x, x, r, advantages, mask, S(beta=beta, aggregation=aggregation)
    )[0]
    return jax.grad(reinforce)(lp), jax.grad(loss)(lp, 0.0, None), jax.grad(loss)(lp, 0.05, ref)

  g_reinforce, g_grpo, g_grpo_kl = grads(logp)
  np.testing.assert_allclose(g_grpo, g_reinforce, atol=1e-6)
  # The k3 term adds β (1 − exp(ref − logp)) w per token.
  expected = g_reinforce + 0.05 * (1.0 - np.exp(ref - logp)) * w
  np.testing.assert_allclose(g_grpo_kl, expected, atol=1e-6)


def test_clipping_zeroes_gradient_beyond_clip_range():
  logp = np.array([[0.5], [-0.5], [-0.5], [0.5]], np.float32)
  advantages = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
  loss = lambda lp: grpo.grpo_loss(lp, np.zeros((4, 1)), None, advantages, np.ones((4, 1)))[0]
  grads = jax.jit(jax.grad(loss))(logp)[:, 0]
  assert float(grads[0]) == 0.0  # Â > 0, ρ = 1.65 > 1 + eps_high
  assert float(grads[1]) == 0.0  # Â < 0, ρ = 0.61 < 1 − eps_low
  # On the unclipped (pessimistic) side the gradient is −Â ρ w, with w = 1/4.
  np.testing.assert_allclose(grads[2:], [-math.exp(-0.5) / 4, math.exp(0.5) / 4], rtol=1e-6)


def test_k3_nonnegative_and_zero_at_equal_policies():
  logp, ref = 5.0 * _rng(2).normal(size=(2, 1000)).astype(np.float32)
  k3 = jax.jit(grpo.k3_kl)
  assert np.all(np.asarray(k3(logp, ref)) >= 0.0)
  assert np.all(np.asarray(k3(logp, logp)) == 0.0)


def test_k3_mean_approximates_true_kl_on_toy_categorical():
  log_p = _log_softmax(np.array([2.0, 1.0, 0.0, -1.0, 0.5]))  # π_θ, samples come from it
  log_q = _log_softmax(np.array([0.0, 1.5, 0.5, 0.0, -1.0]))  # π_ref
  true_kl = float(np.sum(np.exp(log_p) * (log_p - log_q)))
  n = 50_000
  samples = _rng(3).choice(5, size=n, p=np.exp(log_p))
  logp, ref = log_p[samples][None].astype(np.float32), log_q[samples][None].astype(np.float32)
  _, metrics = grpo_loss(logp, logp, ref, np.zeros(1), np.ones((1, n)), S(beta=1.0))
  k3 = np.exp(ref - logp) - (ref - logp) - 1.0
  standard_error = float(k3.std()) / math.sqrt(n)
  assert abs(float(metrics["kl"]) - true_kl) < 5.0 * standard_error
  assert true_kl > 10.0 * standard_error  # the test can tell the KL from 0


def test_grpo_loss_errors():
  logp, adv, mask = np.zeros((2, 3)), np.zeros(2), np.ones((2, 3))
  with pytest.raises(ValueError, match=r"old_logp shape \(2, 4\).*logp shape \(2, 3\)"):
    grpo.grpo_loss(logp, np.zeros((2, 4)), None, adv, mask)
  with pytest.raises(ValueError, match=r"mask shape \(3, 2\).*\(2, 3\)"):
    grpo.grpo_loss(logp, logp, None, adv, np.ones((3, 2)))
  with pytest.raises(ValueError, match=r"advantages shape \(2, 1\)"):
    grpo.grpo_loss(logp, logp, None, np.zeros((2, 1)), mask)
  with pytest.raises(ValueError, match=r"^LossSettings\.beta=-0\.1 must be >= 0"):
    S(beta=-0.1)
  with pytest.raises(ValueError, match="ref_logp is None but beta=0.04"):
    grpo.grpo_loss(logp, logp, None, adv, mask, S(beta=0.04))
  with pytest.raises(ValueError, match="ref_logp is None but beta is traced"):
    jax.jit(grpo.grpo_loss)(
      logp, logp, None, adv, mask, S(beta=0.0)
    )  # traced beta: cannot tell it is 0
  with pytest.raises(ValueError, match="^LossSettings.aggregation='seq_mean'"):
    S(aggregation="seq_mean")
  with pytest.raises(ValueError, match=r"^LossSettings\.eps_low=1\.5 must be in \[0, 1\)"):
    S(eps_low=1.5)
  with pytest.raises(ValueError, match=r"^LossSettings\.eps_high=-0\.1 must be >= 0"):
    S(eps_high=-0.1)
  with pytest.raises(ValueError, match="max_length=2"):
    grpo.grpo_loss(logp, logp, None, adv, mask, S(aggregation="dr_grpo"), max_length=2)


def test_jit_no_retrace_with_traced_hyperparameters():
  traces = []

  @functools.partial(jax.jit, static_argnames="aggregation")
  def step(rewards, logp, old, ref, mask, beta, eps_high, aggregation):
    traces.append(aggregation)
    advantages, stats = grpo.group_advantages(rewards, std="unbiased")
    loss, metrics = grpo.grpo_loss(
      logp,
      old,
      ref,
      advantages.reshape(-1),
      mask,
      S(beta=beta, eps_high=eps_high, aggregation=aggregation),
    )
    return loss, metrics, stats

  rng = _rng(4)
  logp, old, ref = rng.normal(size=(3, 8, 5)).astype(np.float32)
  rewards, mask = rng.normal(size=(2, 4)).astype(np.float32), np.ones((8, 5), np.float32)
  loss1, _, _ = step(rewards, logp, old, ref, mask, 0.01, 0.2, aggregation="token_mean")
  loss2, _, _ = step(rewards + 1.0, logp, old, ref, mask, 0.02, 0.28, aggregation="token_mean")
  assert len(traces) == 1
  assert loss1.dtype == jnp.float32 and np.isfinite(float(loss2))
  advantages, _ = group_advantages(rewards, std="unbiased")
  loss_ref, _ = grpo_loss(
    logp, old, ref, advantages.reshape(-1), mask, S(beta=0.01, aggregation="token_mean")
  )
  np.testing.assert_allclose(loss1, loss_ref, rtol=1e-6)


def test_grpo_loss_bf16_inputs_compute_in_float32():
  logp = -_rng(5).uniform(0.5, 2.0, (2, 4)).astype(np.float32)
  args = (logp, logp + 0.1, logp - 0.1, np.array([1.0, -1.0]), np.ones((2, 4)))
  args16 = [jnp.asarray(a, jnp.bfloat16) for a in args]
  loss16, metrics16 = grpo_loss(*args16, S(beta=0.1))
  # Same as upcasting the bf16 values first, i.e. no arithmetic happened in bf16.
  loss32, metrics32 = grpo_loss(*(a.astype(jnp.float32) for a in args16), S(beta=0.1))
  assert loss16.dtype == jnp.float32 and metrics16["kl"].dtype == jnp.float32
  assert float(loss16) == float(loss32) and float(metrics16["kl"]) == float(metrics32["kl"])


def test_token_logprobs_from_logits_golden():
  logits = np.array([[[0.0, 0.0, math.log(2.0)], [0.0, 2 * math.log(2.0), -np.inf]]], np.float32)
  targets = np.array([[2, 0]])
  logp, entropy = logprobs(jnp.asarray(logits, jnp.bfloat16), targets)
  assert logp.dtype == entropy.dtype == jnp.float32
  # Row 0: p = (1/4, 1/4, 1/2), H = 1.5 ln 2. Row 1: p = (1/5, 4/5, 0), with 0·log 0 = 0.
  np.testing.assert_allclose(logp[0], [math.log(0.5), math.log(0.2)], rtol=1e-2)
  h1 = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
  np.testing.assert_allclose(entropy[0], [1.5 * math.log(2.0), h1], rtol=1e-2)
  # Temperature 2 halves the logits: row 1 becomes p = (1/3, 2/3, 0).
  logp_t, _ = logprobs(logits, targets, temperature=2.0)
  np.testing.assert_allclose(logp_t[0, 1], math.log(1 / 3), rtol=1e-6)
  total = lambda x: sum(jnp.sum(v) for v in grpo.token_logprobs_from_logits(x, targets))
  assert np.all(np.isfinite(np.asarray(jax.jit(jax.grad(total))(logits))))


@pytest.mark.parametrize("chunk_size", [1, 3])  # 3 leaves a tail of one position
def test_chunked_token_logprobs_equal_unchunked(chunk_size):
  rng = _rng(6)
  logits = (3.0 * rng.normal(size=(2, 7, 11))).astype(np.float32)
  targets = rng.integers(0, 11, (2, 7))
  w = rng.normal(size=(2, 2, 7)).astype(np.float32)

  @functools.partial(jax.jit, static_argnums=1)
  def value_and_grad(x, chunk):
    def f(x):
      logp, entropy = grpo.token_logprobs_from_logits(x, targets, chunk_size=chunk)
      return jnp.sum(w[0] * logp + w[1] * entropy), (logp, entropy)

    return jax.value_and_grad(f, has_aux=True)(x)

  (_, (logp, ent)), grads = value_and_grad(logits, None)
  (_, (logp_c, ent_c)), grads_c = value_and_grad(logits, chunk_size)
  np.testing.assert_allclose(logp_c, logp, atol=1e-6, rtol=0)
  np.testing.assert_allclose(ent_c, ent, atol=1e-6, rtol=0)
  np.testing.assert_allclose(grads_c, grads, atol=1e-6, rtol=0)
  expected = np.take_along_axis(_log_softmax(logits), targets[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(logp, expected, atol=1e-5)


def test_chunking_bounds_temporary_memory():
  # Compiled only (no data): float32 [B, T, V] is 16 MB, one chunk of 32 positions 2 MB.
  logits = jax.ShapeDtypeStruct((2, 256, 8192), jnp.float32)
  targets = jax.ShapeDtypeStruct((2, 256), jnp.int32)

  def temp_bytes(chunk_size, grad):
    f = lambda x, t: sum(
      jnp.sum(v) for v in grpo.token_logprobs_from_logits(x, t, chunk_size=chunk_size)
    )
    analysis = (
      jax.jit(jax.grad(f) if grad else f).lower(logits, targets).compile().memory_analysis()
    )
    if analysis is None:
      pytest.skip("this backend reports no memory analysis")
    return analysis.temp_size_in_bytes

  for grad in (False, True):
    full, chunked = temp_bytes(None, grad), temp_bytes(32, grad)
    assert full >= 16 * 2**20 and chunked < full / 4, (grad, full, chunked)


def test_token_logprobs_shift_convention_and_padding():
  vocab = 13
  table = _rng(7).normal(size=(vocab, vocab)).astype(np.float32)  # bigram: logits_t = table[x_t]
  apply_fn = lambda params, tokens, mask: params[tokens]  # [B, S, V]
  tokens = np.array([[0, 0, 5, 7, 2, 9], [3, 4, 1, 1, 8, 0]])
  mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])  # left- and right-padding
  run = jax.jit(functools.partial(grpo.token_logprobs, apply_fn, chunk_size=2))
  logp, entropy = run(table, tokens, mask)
  assert logp.shape == entropy.shape == (2, 5)
  log_probs = _log_softmax(table)
  for b in range(2):
    for t in range(5):
      if mask[b, t] and mask[b, t + 1]:
        np.testing.assert_allclose(logp[b, t], log_probs[tokens[b, t], tokens[b, t + 1]], rtol=1e-5)
        h = -np.sum(np.exp(log_probs[tokens[b, t]]) * log_probs[tokens[b, t]])
        np.testing.assert_allclose(entropy[b, t], h, rtol=1e-5)
      else:
        assert float(logp[b, t]) == 0.0 and float(entropy[b, t]) == 0.0


def test_token_logprobs_errors():
  logits, targets = np.zeros((2, 3, 5)), np.zeros((2, 3), np.int32)
  with pytest.raises(ValueError, match=r"targets shape \(2, 4\)"):
    grpo.token_logprobs_from_logits(logits, np.zeros((2, 4), np.int32))
  with pytest.raises(ValueError, match="chunk_size=0"):
    grpo.token_logprobs_from_logits(logits, targets, chunk_size=0)
  with pytest.raises(ValueError, match="temperature=0.0"):
    grpo.token_logprobs_from_logits(logits, targets, temperature=0.0)
  with pytest.raises(ValueError, match=r"logits of shape \(2, 5\)"):
    grpo.token_logprobs(lambda p, t, m: jnp.zeros((2, 5)), None, targets, np.ones((2, 3)))
