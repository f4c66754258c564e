"""Tests for es_jax.es.fitness: hand-computed golden values, ties, all-equal, non-finite fitness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from es_jax.es import fitness

zscore = jax.jit(fitness.zscore)
centered_rank = jax.jit(fitness.centered_rank)
per_prompt_zscore = jax.jit(fitness.per_prompt_zscore)


def test_zscore_golden():
  # mean 2.5, population std sqrt(1.25) = 1.1180340 (ddof 0).
  got = zscore(jnp.array([1.0, 2.0, 3.0, 4.0]))
  np.testing.assert_allclose(got, [-1.3416408, -0.4472136, 0.4472136, 1.3416408], rtol=1e-6)
  assert got.dtype == jnp.float32
  # The +1e-8 is the paper's: for std = 1e-7 it changes the weights by ~10%.
  tiny = fitness.zscore(jnp.array([0.0, 2e-7]))
  np.testing.assert_allclose(tiny, [-1e-7 / 1.1e-7, 1e-7 / 1.1e-7], rtol=1e-5)


def test_zscore_int_input_and_reference():
  r = np.array([3, 0, 7, 7, 1], np.int32)
  got = zscore(r)
  want = (r - r.mean()) / (r.std() + 1e-8)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_centered_rank_golden_with_ties():
  # ranks 0, 3, and a tie for 1 and 2 -> 1.5 each; w = rank / 3 - 1/2.
  np.testing.assert_allclose(centered_rank(jnp.array([1.0, 3.0, 2.0, 2.0])), [-0.5, 0.5, 0, 0])
  r = np.random.default_rng(0).standard_normal(9).astype(np.float32)
  want = np.argsort(np.argsort(r)) / 8.0 - 0.5  # distinct values: plain ranks
  np.testing.assert_allclose(fitness.centered_rank(r), want, atol=1e-7)
  assert fitness.centered_rank(jnp.array([4.0])).tolist() == [0.0]


def test_per_prompt_zscore_golden():
  # R [N=3, P=2]; column means (2/3, 1/3); C = [[1/3, -1/3], [-2/3, -1/3], [1/3, 2/3]];
  # s = sqrt(mean(C^2)) = sqrt(2/9); row means of C = (0, -1/2, 1/2).
  got = per_prompt_zscore(jnp.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
  np.testing.assert_allclose(got, [0.0, -1.0606602, 1.0606602], rtol=1e-6, atol=1e-7)
  # A constant prompt contributes zero but still counts in the global std:
  # C col 0 = (1/3, -2/3, 1/3), col 1 = 0; s = 1/3; row means = (1/6, -1/3, 1/6).
  want = [0.5, -1.0, 0.5]
  for const in (5.0, 0.1):  # 0.1: its float32 column mean leaves a residue that must not leak
    got = per_prompt_zscore(jnp.array([[1.0, const], [0.0, const], [1.0, const]]))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("fn", [zscore, centered_rank])
def test_all_equal_gives_exact_zeros(fn):
  # 0.1 is not representable: the float32 mean of seven copies is not 0.1 exactly.
  got = fn(jnp.full((7,), 0.1))
  assert np.all(np.asarray(got) == 0.0)
  assert np.all(np.asarray(fn(jnp.full((7,), jnp.nan))) == 0.0)


def test_per_prompt_all_equal_gives_exact_zeros():
  assert np.all(np.asarray(per_prompt_zscore(jnp.full((3, 2), 0.1))) == 0.0)


def test_non_finite_ranks_worst_zscore():
  # NaN -> min_finite - range = 1 - 2 = -1: R = (1, -1, 3, 2), mean 1.25, std sqrt(2.1875).
  got = zscore(jnp.array([1.0, jnp.nan, 3.0, 2.0]))
  np.testing.assert_allclose(got, [-0.1690309, -1.5212777, 1.1832160, 0.5070926], rtol=1e-6)
  # +inf and -inf both rank worst: R -> (-1, 0, -1, 1).
  got = zscore(jnp.array([jnp.inf, 0.0, -jnp.inf, 1.0]))
  np.testing.assert_allclose(got, [-0.9045340, 0.3015113, -0.9045340, 1.5075567], rtol=1e-6)
  # Equal finite values and one NaN: the gap is 1, the NaN member is pushed away from.
  got = zscore(jnp.array([0.0, 0.0, jnp.nan, 0.0]))
  assert np.all(np.isfinite(got)) and np.argmin(got) == 2 and got[0] > 0


def test_non_finite_ranks_worst_centered_rank():
  # NaN and -inf tie for the worst rank: ranks (0.5, 3, 0.5, 2) / 3 - 1/2.
  got = centered_rank(jnp.array([jnp.nan, 5.0, -jnp.inf, 3.0]))
  np.testing.assert_allclose(got, [-1 / 3, 0.5, -1 / 3, 1 / 6], rtol=1e-6)
  got = centered_rank(jnp.array([jnp.inf, 5.0, 1.0, 3.0]))
  assert np.argmin(got) == 0


def test_non_finite_ranks_worst_per_prompt():
  # Column 0: NaN -> 0 - 1 = -1, C = (1, -1, 0); column 1: C = (1/3, -2/3, 1/3);
  # s = sqrt((2 + 2/3) / 6) = 2/3; row means (2/3, -5/6, 1/6) / s = (1, -1.25, 0.25).
  got = per_prompt_zscore(jnp.array([[1.0, 1.0], [jnp.nan, 0.0], [0.0, 1.0]]))
  np.testing.assert_allclose(got, [1.0, -1.25, 0.25], rtol=1e-6)


def test_weights_sum_to_zero_and_are_finite():
  rng = np.random.default_rng(1)
  r = rng.standard_normal(7).astype(np.float32)
  r[3] = np.nan
  for w in (zscore(r), centered_rank(r)):
    assert np.all(np.isfinite(w)) and abs(float(jnp.sum(w))) < 1e-5 and np.argmin(w) == 3
  w = per_prompt_zscore(rng.standard_normal((3, 2)).astype(np.float32))
  assert abs(float(jnp.sum(w))) < 1e-5


def test_bad_shapes_and_names():
  with pytest.raises(
    ValueError, match=r"zscore expects fitness of shape \[N\], got shape \(2, 3\)"
  ):
    fitness.zscore(jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match=r"per_prompt_zscore expects .*got shape \(4,\)"):
    fitness.per_prompt_zscore(jnp.zeros((4,)))
  with pytest.raises(ValueError, match="shaping='rank'"):
    fitness.get_shaping("rank")


@pytest.mark.slow
def test_shuffled_is_a_key_determined_permutation_of_zscore():
  r = jnp.arange(8, dtype=jnp.float32) ** 2  # distinct values
  key = jax.random.key(3)
  w = fitness.shape_fitness(r, population_size=8, shaping="shuffled", key=key)
  z = fitness.zscore(r)
  # The same multiset of weights as zscore (same drift), assigned to other members.
  np.testing.assert_allclose(np.sort(np.asarray(w)), np.sort(np.asarray(z)), rtol=1e-6)
  assert not np.allclose(w, z)
  perm = jax.random.permutation(jax.random.fold_in(key, fitness.SHUFFLE_TAG), 8)
  np.testing.assert_allclose(w, fitness.zscore(r[perm]), rtol=0, atol=0)
  # Same key, same weights; another key, another permutation.
  again = fitness.shape_fitness(r, population_size=8, shaping="shuffled", key=key)
  np.testing.assert_array_equal(w, again)
  other = fitness.shape_fitness(r, population_size=8, shaping="shuffled", key=jax.random.key(4))
  assert not np.array_equal(w, other)
  # Over many steps the weight a member gets does not track its fitness (no signal).
  keys = jax.random.split(jax.random.key(0), 400)
  ws = jax.vmap(lambda k: fitness.shuffled(r, k))(keys)  # [400, 8]
  corr = np.corrcoef(np.asarray(ws).mean(0), np.asarray(r))[0, 1]
  assert abs(float(np.asarray(ws).mean(0)[-1])) < 0.25 and abs(corr) < 0.9
  np.testing.assert_array_equal(fitness.shuffled(jnp.ones(8), key), np.zeros(8))
  with pytest.raises(ValueError, match="needs the step key"):
    fitness.shape_fitness(r, population_size=8, shaping="shuffled")
