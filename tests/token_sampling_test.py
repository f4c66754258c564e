"""es_jax.decode.token_sampling: sampled frequencies against the softmax and the renormalised
nucleus,
the blocked inverse CDF and nucleus threshold against sorted references, and the helpers."""

import jax
import jax.numpy as jnp
import numpy as np

from es_jax.decode.token_sampling import (
  _inverse_cdf,
  _nucleus_threshold,
  argmax,
  logprob_and_entropy,
  sample_from_uniform,
)


def sample_token(logits, key, temperature, top_p, *, use_top_p: bool):
  """One uniform per row drawn from `key`, then the decode loop's sampler (logits [B, V])."""
  u = jax.random.uniform(key, logits.shape[:-1])
  return sample_from_uniform(logits, u, temperature, top_p, use_top_p=use_top_p)


def test_temperature_sampling_matches_softmax():
  logits = jnp.log(jnp.asarray([0.5, 0.25, 0.15, 0.1, 0.0]))  # last token impossible
  n = 40_000
  batch = jnp.tile(logits * 2.0, (n, 1))  # temperature 2 undoes the scaling
  toks = np.asarray(
    jax.jit(sample_token, static_argnames="use_top_p")(
      batch, jax.random.key(3), 2.0, 1.0, use_top_p=False
    )
  )
  freq = np.bincount(toks, minlength=5) / n
  expected = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
  se = np.sqrt(expected * (1 - expected) / n)
  assert np.all(np.abs(freq - expected) <= 5 * se + 1e-12), freq
  assert freq[4] == 0


def test_top_p_never_samples_outside_the_nucleus():
  logits = jnp.log(jnp.asarray([0.05, 0.4, 0.3, 0.15, 0.1]))
  n = 20_000
  toks = np.asarray(
    jax.jit(sample_token, static_argnames="use_top_p")(
      jnp.tile(logits, (n, 1)), jax.random.key(4), 1.0, 0.7, use_top_p=True
    )
  )
  # Nucleus for p = 0.7: tokens 1 (0.4) and 2 (0.3) reach 0.7; renormalised 4/7 and 3/7.
  freq = np.bincount(toks, minlength=5) / n
  assert set(np.unique(toks)) == {1, 2}
  assert abs(freq[1] - 4 / 7) < 5 * np.sqrt((4 / 7) * (3 / 7) / n)


def test_inverse_cdf_matches_searchsorted_across_blocks():
  rng = np.random.RandomState(0)
  w = rng.exponential(size=(64, 1000)).astype(np.float32)  # 4 blocks of 256, the last partial
  w[:, 300:520] = 0.0  # an empty block and zero weights inside others
  u = rng.uniform(size=64).astype(np.float32)
  got = np.asarray(jax.jit(_inverse_cdf)(w, u))
  cdf = np.cumsum(w.astype(np.float64), axis=-1)
  target = u * cdf[:, -1]
  want = np.array([np.searchsorted(c, t, side="left") for c, t in zip(cdf, target, strict=True)])
  near_edge = np.abs(cdf[np.arange(64), want] - target) < 1e-4 * cdf[:, -1]
  np.testing.assert_array_equal(got[~near_edge], want[~near_edge])
  assert (w[np.arange(64), got] > 0).all()


def test_nucleus_threshold_equals_sorted_prefix():
  rng = np.random.RandomState(1)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(rng.normal(size=(32, 2000)) * 2.5), axis=-1))
  top_p = rng.uniform(0.05, 0.99, size=32).astype(np.float32)
  t = np.asarray(jax.jit(_nucleus_threshold)(jnp.asarray(probs), jnp.asarray(top_p)))
  for row, p, thr in zip(probs, top_p, t, strict=True):
    order = np.argsort(-row, kind="stable")
    mass_before = np.cumsum(row[order].astype(np.float64)) - row[order]
    want = set(order[mass_before < p])
    assert set(np.flatnonzero(row >= thr)) == want


def test_top_p_sampling_over_a_large_vocab_matches_the_renormalised_nucleus():
  rng = np.random.RandomState(2)
  logits = jnp.asarray(rng.normal(size=(700,)) * 2.0, jnp.float32)
  probs = np.asarray(jax.nn.softmax(logits))
  order = np.argsort(-probs)
  nucleus = order[(np.cumsum(probs[order]) - probs[order]) < 0.8]
  n = 20_000
  toks = np.asarray(
    jax.jit(sample_token, static_argnames="use_top_p")(
      jnp.tile(logits, (n, 1)), jax.random.key(7), 1.0, 0.8, use_top_p=True
    )
  )
  assert set(np.unique(toks)) <= set(nucleus)
  expected = np.zeros_like(probs)
  expected[nucleus] = probs[nucleus] / probs[nucleus].sum()
  freq = np.bincount(toks, minlength=700) / n
  se = np.sqrt(expected * (1 - expected) / n)
  assert np.all(np.abs(freq - expected) <= 5 * se + 1e-12)


def test_argmax_and_logprob_entropy_helpers():
  rng = np.random.RandomState(3)
  logits = jnp.asarray(rng.normal(size=(5, 777)) * 3, jnp.float32)
  logits = logits.at[1, 10].set(logits[1].max() + 1).at[1, 20].set(logits[1].max() + 1)  # a tie
  np.testing.assert_array_equal(np.asarray(argmax(logits)), np.asarray(jnp.argmax(logits, -1)))
  toks = jnp.asarray(rng.randint(0, 777, 5))
  logp, ent = logprob_and_entropy(logits, toks)
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  np.testing.assert_allclose(logp, jnp.take_along_axis(logp_all, toks[:, None], -1)[:, 0], 1e-5)
  np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(logp_all) * logp_all, -1), rtol=1e-5)
