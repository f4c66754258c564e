"""Tests for es_jax.metrics: exact binomial references, hand-computed goldens, toy policies; and
the macro average and token entropy as the runs compute them."""

import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from es_jax import metrics
from es_jax.decode.sampling import Completions
from es_jax.grpo import rollout as grpo_rollout
from experiments.evaluation import results as eval_results

LN2 = math.log(2.0)


def _h(p):
  return -sum(x * math.log(x) for x in (p, 1 - p) if x > 0)


# ------------------------------------------------------------------------------------ pass@k


def test_pass_at_k_matches_exact_binomial_for_all_n_up_to_40():
  for n in range(1, 41):
    c = np.arange(n + 1)
    for k in range(1, n + 1):
      got = metrics.pass_at_k(n, c, k)
      want = [1 - Fraction(math.comb(n - ci, k), math.comb(n, k)) for ci in range(n + 1)]
      np.testing.assert_allclose(got, np.array(want, np.float64), rtol=0, atol=1e-12)


def test_pass_at_k_edge_cases_and_large_n_stability():
  assert metrics.pass_at_k(32, 0, 16) == 0.0
  assert metrics.pass_at_k(32, 32, 1) == 1.0
  assert metrics.pass_at_k(32, 17, 16) == 1.0  # n - c < k
  np.testing.assert_allclose(metrics.pass_at_k(32, np.arange(33), 1), np.arange(33) / 32)
  # C(10000, 100) overflows float64; the product form does not.
  exact = 1 - Fraction(math.comb(9990, 100), math.comb(10000, 100))
  np.testing.assert_allclose(metrics.pass_at_k(10000, 10, 100), float(exact), rtol=1e-12)
  # Broadcast over per-problem n and c.
  got = metrics.pass_at_k(np.array([4, 8]), np.array([1, 2]), 2)
  np.testing.assert_allclose(got, [1 - 3 / 6, 1 - 15 / 28])


@pytest.mark.parametrize(
  "n,c,k,match",
  [(4, 5, 1, "0 <= c <= n"), (4, -1, 1, "0 <= c"), (4, 1, 5, "exceeds"), (4, 1, 0, "at least 1")],
)
def test_pass_at_k_rejects_bad_counts(n, c, k, match):
  with pytest.raises(ValueError, match=match):
    metrics.pass_at_k(n, c, k)


def test_pass_at_k_rejects_float_counts():
  with pytest.raises(TypeError, match="integers"):
    metrics.pass_at_k(4.0, 1, 1)


# ------------------------------------------------------------------------------------ maj@k


def test_maj_at_k_plurality_abstention_and_ties():
  answers = ["1", "2", "2", None, None, None, "1", "1"]
  assert metrics.maj_at_k(answers, k=3, gold="2") == 1.0  # 2 votes vs 1
  assert metrics.maj_at_k(answers, k=6, gold="2") == 1.0  # None abstains, still 2 vs 1
  assert metrics.maj_at_k(answers, k=8, gold="2") == 0.0  # "1" now has 3 votes
  assert metrics.maj_at_k(["2", "1", "1", "2"], k=4, gold="2") == 1.0  # tie: first seen wins
  assert metrics.maj_at_k(["1", "2", "2", "1"], k=4, gold="2") == 0.0
  assert metrics.maj_at_k([None, None], k=2, gold="2") == 0.0
  # With per-sample correctness, the winner's first occurrence decides.
  assert metrics.maj_at_k(["a", "b", "b"], k=3, correct=[False, True, True]) == 1.0
  assert metrics.maj_at_k(["a", "b", "b"], k=1, correct=[False, True, True]) == 0.0


def test_maj_at_k_argument_errors():
  with pytest.raises(ValueError, match="exactly one"):
    metrics.maj_at_k(["1"], k=1)
  with pytest.raises(ValueError, match="k=2"):
    metrics.maj_at_k(["1"], k=2, gold="1")


def test_macro_average_of_task_summaries():
  """The macro average as evaluation writes it (experiments.evaluation.results.macro): the
  unweighted mean of the task means, problem counts summed, curves cut to the shortest."""
  a = {"num_problems": 2, "pass@1": 0.5, "pass_at_k_curve": {"k": [1, 2], "value": [0.5, 0.6]}}
  b = {"num_problems": 4, "pass@1": 0.75, "pass_at_k_curve": {"k": [1], "value": [0.75]}}
  out = eval_results.macro({"a": a, "b": b})
  assert out["pass@1"] == pytest.approx(0.625)  # not the pooled 4/6 over problems
  assert out["num_problems"] == 6
  assert out["pass_at_k_curve"] == {"k": [1], "value": [pytest.approx(0.625)]}
  with pytest.raises(ValueError, match="no task summaries"):
    eval_results.macro({})


# ------------------------------------------------------------------------------------ diversity


def test_js_success_golden_values():
  assert float(metrics.js_success_diversity(jnp.array([[0.0], [1.0]]))) == pytest.approx(LN2)
  assert float(metrics.js_success_diversity(jnp.full((4, 3), 0.3))) == pytest.approx(0.0, abs=1e-6)
  p = np.array([[0.5, 0.2], [1.0, 0.2]])
  want = [_h(0.75) - (_h(0.5) + _h(1.0)) / 2, 0.0]
  got = metrics.js_success_diversity(p, average=False)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert float(metrics.js_success_diversity(p)) == pytest.approx(np.mean(want), abs=1e-6)
  assert float(jax.jit(metrics.js_success_diversity)(p)) == pytest.approx(np.mean(want), abs=1e-6)


def test_success_union_golden_and_inequality():
  p = np.array([[0.5, 0.0], [0.0, 0.0]])
  u = metrics.success_union(p)
  np.testing.assert_allclose(u.population, [0.5, 0.0], atol=1e-6)
  np.testing.assert_allclose(u.mean_policy, [1 - 0.75**2, 0.0], atol=1e-6)
  p = np.random.default_rng(0).uniform(size=(8, 64))
  u = metrics.success_union(p)
  assert np.all(np.asarray(u.population) >= np.asarray(u.mean_policy) - 1e-6)
  np.testing.assert_allclose(u.population, 1 - np.prod(1 - p, axis=0), rtol=1e-5)


def test_js_policy_golden_values():
  # Identical members: every log-likelihood equal across scorers -> exactly 0.
  ll = np.broadcast_to(np.log([0.2, 0.5, 0.3]), (3, 3, 3))
  assert float(metrics.js_policy_diversity(ll)) == pytest.approx(0.0, abs=1e-6)
  # Two deterministic members on different sequences -> ln 2.
  ll = np.array([[[0.0], [-np.inf]], [[-np.inf], [0.0]]])
  assert float(metrics.js_policy_diversity(ll)) == pytest.approx(LN2, abs=1e-6)
  # Leading (prompt) axes are kept.
  assert metrics.js_policy_diversity(np.zeros((5, 2, 2, 4))).shape == (5,)
  with pytest.raises(ValueError, match=r"\[\.\.\., N, N, S\]"):
    metrics.js_policy_diversity(np.zeros((2, 3, 4)))


def _toy_policies(rng, members, vocab, length):
  """Autoregressive (bigram) policies; exact log-probs of all vocab**length sequences."""
  seqs = np.array(list(itertools.product(range(vocab), repeat=length)))  # [V^L, L]
  logp = np.zeros((members, len(seqs)))
  for i in range(members):
    first = np.log(rng.dirichlet(np.ones(vocab)))
    trans = np.log(rng.dirichlet(np.ones(vocab), size=vocab))  # [prev, next]
    logp[i] = first[seqs[:, 0]] + trans[seqs[:, :-1], seqs[:, 1:]].sum(axis=1)
  return seqs, logp


def _entropy(logp):
  return -np.sum(np.exp(logp) * logp, axis=-1)


def test_js_policy_monte_carlo_converges_to_enumeration_and_bounds_js_success():
  rng = np.random.default_rng(1)
  members, samples = 3, 20000
  seqs, logp = _toy_policies(rng, members, vocab=3, length=3)
  mixture = np.log(np.exp(logp).mean(axis=0))
  js_exact = _entropy(mixture) - _entropy(logp).mean()
  assert js_exact > 0.05  # a non-trivial toy
  draws = np.stack([rng.choice(len(seqs), size=samples, p=np.exp(logp[j])) for j in range(members)])
  ll = logp[:, draws]  # [scoring i, sampling j, S]
  assert float(metrics.js_policy_diversity(ll)) == pytest.approx(js_exact, abs=0.02)
  # JS_succ <= JS_pol for any verifier (any set of "correct" sequences): data processing.
  correct = rng.uniform(size=(len(seqs), 200)) < rng.uniform(size=200)  # [V^L, verifiers]
  p = np.exp(logp) @ correct  # [N, verifiers]
  js_succ = np.asarray(metrics.js_success_diversity(p, average=False))
  assert js_succ.max() > 0.01
  assert np.all(js_succ <= js_exact + 1e-6)


# ------------------------------------------------------------------------ entropy, drift, sparsity


def test_rollout_entropy_is_the_masked_mean_per_generated_token():
  """The token entropy GRPO logs (es_jax.grpo.rollout.rollout_stats, jitted): padding left out."""
  entropy = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
  tokens = jnp.zeros((2, 3), jnp.int32)
  lengths = mask.sum(-1).astype(jnp.int32)
  done = Completions(tokens, jnp.zeros_like(entropy), entropy, mask, lengths)
  assert float(grpo_rollout.rollout_stats(done)["rollout_entropy"]) == pytest.approx(2.0)
  empty = done._replace(mask=jnp.zeros_like(mask), lengths=jnp.zeros_like(lengths))
  assert float(grpo_rollout.rollout_stats(empty)["rollout_entropy"]) == 0.0


def test_relative_drift_golden():
  base = {"w": np.array([3.0, 0.0], np.float32), "b": np.array([4.0], np.float32)}
  tuned = {"w": np.array([3.0, 1.0], np.float32), "b": np.array([6.0], np.float32)}
  assert float(metrics.relative_drift(tuned, base)) == pytest.approx(math.sqrt(5) / 5)
  assert float(jax.jit(metrics.relative_drift)(base, base)) == 0.0
  with pytest.raises(ValueError, match="structure"):
    metrics.relative_drift({"w": base["w"]}, base)


def test_update_sparsity_golden():
  delta = {
    "w": jnp.array([0.0, 1e-4, -5e-4, 2e-3]),
    "b": [jnp.array([[0.0, -1e-3]]), jnp.array([0.5], jnp.bfloat16)],
  }
  # Changed: 1e-4, 5e-4, 2e-3, 1e-3, 0.5 (5); small (<= 1e-3): 1e-4, 5e-4, 1e-3 (3).
  assert float(metrics.update_sparsity(delta, 1e-3)) == pytest.approx(3 / 5)
  assert float(metrics.update_sparsity(delta, 0.0)) == 0.0
  assert float(metrics.update_sparsity(delta, 1.0)) == 1.0
  assert float(metrics.update_sparsity({"w": jnp.zeros(3)}, 1e-3)) == 0.0
  assert float(jax.jit(metrics.update_sparsity)(delta, 1e-3)) == pytest.approx(3 / 5)


def test_threshold_update_golden_keeps_dtype():
  base = {"w": jnp.array([1.0, 1.0, 1.0, 1.0]), "n": jnp.array([1.0, 2.0], jnp.bfloat16)}
  tuned = {"w": jnp.array([1.0, 1.0005, 0.9995, 0.997]), "n": jnp.array([1.0, 2.5], jnp.bfloat16)}
  out = jax.jit(metrics.threshold_update)(base, tuned, 1e-3)
  np.testing.assert_array_equal(out["w"], np.array([1.0, 1.0, 1.0, 0.997], np.float32))
  assert out["n"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(out["n"].astype(jnp.float32), [1.0, 2.5])
  # Sparsity of the kept update is 0: everything small was reset.
  delta = jax.tree_util.tree_map(lambda a, b: a.astype(jnp.float32) - b, out, base)
  assert float(metrics.update_sparsity(delta, 1e-3)) == 0.0
