"""Evaluation metrics: Pass@k, Maj@k, JS diversity, drift and update sparsity.

Counting metrics (`pass_at_k`, `maj_at_k`) run on the host in float64 NumPy: they consume
per-problem correctness counts. Array metrics on model outputs and parameters
(`js_*`, `relative_drift`, `update_sparsity`, `threshold_update`) use `jax.numpy`,
accept NumPy or JAX inputs (pytrees for parameters) and are jittable.

Axis letters: N population members, P prompts, S sampled sequences per member, B batch, T tokens.
References: Chen et al. 2021 (Pass@k); docs/method.md §5–7 (the study's definitions).
"""

import math
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------------
# Pass@k, Maj@k


def pass_at_k(n: Any, c: Any, k: int) -> np.ndarray:
  """Unbiased Pass@k estimator per problem (Chen et al. 2021).

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{j=n−c+1}^{n} (1 − k / j),   and 1 if n − c < k.

  The product form never forms a binomial coefficient, so it is stable for any n.

  Args:
    n: samples drawn per problem (int or int array, broadcast against `c`).
    c: correct samples per problem, 0 ≤ c ≤ n (int or int array).
    k: the k of Pass@k, 1 ≤ k ≤ min(n).

  Returns:
    float64 array of the broadcast shape of n and c (0-d for scalars).
  """
  n, c = np.broadcast_arrays(np.asarray(n), np.asarray(c))
  if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(c.dtype, np.integer)):
    raise TypeError(f"pass_at_k: n and c must be integers, got dtypes {n.dtype} and {c.dtype}.")
  k = int(k)
  if k < 1:
    raise ValueError(f"pass_at_k: k={k} must be at least 1.")
  if n.size and (np.any(c < 0) or np.any(c > n)):
    raise ValueError("pass_at_k: need 0 <= c <= n for every problem; check the counts.")
  if n.size and np.any(n < k):
    raise ValueError(f"pass_at_k: k={k} exceeds the samples per problem (min n={n.min()}).")
  if n.size == 0:
    return np.zeros(n.shape, np.float64)
  j = np.arange(1, int(n.max()) + 1, dtype=np.float64)  # [J]
  in_product = (j > (n - c)[..., None]) & (j <= n[..., None])  # [..., J]
  factors = np.where(in_product, 1.0 - k / j, 1.0)
  return np.where(n - c < k, 1.0, 1.0 - np.prod(factors, axis=-1))


def maj_at_k(
  answers: Sequence[Hashable | None],
  *,
  k: int,
  correct: Sequence[bool] | None = None,
  gold: Hashable | None = None,
) -> float:
  """Maj@k for one problem: is the plurality answer among the first k samples correct?

  Failed extractions (None) abstain. Ties go to the answer seen first (deterministic, like
  `collections.Counter.most_common`). All abstentions score 0.

  Args:
    answers: normalised answers of the samples in sampling order (None = no answer).
    k: number of leading samples that vote.
    correct: per-sample correctness (same length as answers); the winner's correctness is that of
      its first occurrence. Pass this when equivalence needs a verifier.
    gold: the normalised gold answer, compared with `==`. Exactly one of correct/gold.

  Returns:
    1.0 if the plurality answer is correct, else 0.0.
  """
  if (correct is None) == (gold is None):
    raise ValueError("maj_at_k: pass exactly one of `correct` (per-sample bools) or `gold`.")
  if not 1 <= k <= len(answers):
    raise ValueError(f"maj_at_k: k={k} must be in [1, len(answers)={len(answers)}].")
  if correct is not None and len(correct) != len(answers):
    raise ValueError(f"maj_at_k: len(correct)={len(correct)} != len(answers)={len(answers)}.")
  votes: dict[Hashable, int] = {}
  first: dict[Hashable, int] = {}
  for i, answer in enumerate(answers[:k]):
    if answer is None:
      continue
    votes[answer] = votes.get(answer, 0) + 1
    first.setdefault(answer, i)
  if not votes:
    return 0.0
  winner = max(votes, key=lambda a: (votes[a], -first[a]))
  if correct is not None:
    return float(bool(correct[first[winner]]))
  return float(winner == gold)


# ---------------------------------------------------------------------------------------------
# Diversity (docs/method.md §6)


def binary_entropy(p: jax.Array) -> jax.Array:
  """h(p) = −p ln p − (1 − p) ln(1 − p) in nats, with 0 ln 0 = 0."""
  p = jnp.clip(jnp.asarray(p, jnp.float32), 0.0, 1.0)
  return jax.scipy.special.entr(p) + jax.scipy.special.entr(1.0 - p)


def js_success_diversity(p: jax.Array, *, average: bool = True) -> jax.Array:
  """Verifier-projected ("success") Jensen–Shannon diversity of a population.

    JS_succ(x) = h(p̄(x)) − (1/N) Σ_i h(p_i(x)),   p̄ = (1/N) Σ_i p_i,

  h the binary entropy in nats. 0 ≤ JS_succ ≤ ln 2, and JS_succ ≤ JS_pol (data processing).

  Args:
    p: [N, P] probability that member i answers prompt x correctly (e.g. c_i / n).
    average: mean over prompts (default) or return the [P] values.

  Returns:
    Scalar (or [P]) float32.
  """
  p = jnp.asarray(p, jnp.float32)
  if p.ndim != 2:
    raise ValueError(f"js_success_diversity: p must be [members, prompts], got shape {p.shape}.")
  js = binary_entropy(p.mean(axis=0)) - binary_entropy(p).mean(axis=0)  # [P]
  return js.mean() if average else js


class SuccessUnion(NamedTuple):
  """One sample from each member: success probability, population vs a single mean policy."""

  population: jax.Array  # [P] 1 − Π_i (1 − p_i)
  mean_policy: jax.Array  # [P] 1 − (1 − p̄)^N


def success_union(p: jax.Array) -> SuccessUnion:
  """Probability that at least one of N members (one sample each) answers correctly.

    population = 1 − Π_i (1 − p_i)  ≥  mean_policy = 1 − (1 − p̄)^N   (AM–GM),

  the gap being ≈ N p̄ (1 − p̄)^{N−1} JS_succ (docs/method.md §6).

  Args:
    p: [N, P] per-member success probabilities.
  """
  p = jnp.asarray(p, jnp.float32)
  if p.ndim != 2:
    raise ValueError(f"success_union: p must be [members, prompts], got shape {p.shape}.")
  population = 1.0 - jnp.exp(jnp.sum(jnp.log1p(-jnp.clip(p, 0.0, 1.0)), axis=0))
  mean_policy = 1.0 - (1.0 - p.mean(axis=0)) ** p.shape[0]
  return SuccessUnion(population=population, mean_policy=mean_policy)


JS_CORRECTIONS = ("null", "miller_madow", "none")


def expected_binary_entropy(n: int, p: Any) -> np.ndarray:
  """E[h(c / n)] for c ~ Binomial(n, p): what the plug-in entropy of n draws averages to.

  Args:
    n: draws (int >= 1).
    p: success probabilities (any shape).

  Returns:
    float64 array of p's shape.
  """
  from scipy import special, stats  # scipy ships with jax; imported here to keep import light

  p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
  c = np.arange(int(n) + 1, dtype=np.float64)
  h = special.entr(c / n) + special.entr(1.0 - c / n)  # [n + 1]
  pmf = stats.binom.pmf(c, int(n), p[..., None])  # [..., n + 1]
  return np.sum(pmf * h, axis=-1)


def js_success_from_counts(counts: Any, n: int, *, correction: str = "null") -> np.ndarray:
  """Per-prompt JS_succ from success counts c_i(x) out of n samples per member (docs/method.md §6).

  The plug-in value h(p̂̄) − (1/N) Σ h(p̂_i), p̂_i = c_i / n, is biased upwards: h is concave, so
  each h(p̂_i) averages below h(p_i) by about 1/(2n) while the pooled h(p̂̄) loses only about
  1/(2Nn). Identical members (a GRPO group, σ = 0) would read ≈ 1/(2n), not 0. Corrections:

  * "null" (default): subtract the plug-in's exact expectation when every member has success
    probability p̂̄, E h(Bin(Nn, p̂̄)/Nn) − E h(Bin(n, p̂̄)/n). Unbiased for identical members;
    also the least biased of the three for moderately different members. It undershoots when
    members are far apart (half at p = 0, half at p = 1: 0.63 for the true 0.69 at n = 8).
  * "miller_madow": add (m − 1)/(2 · draws) to each plug-in entropy, m the non-empty outcomes.
  * "none": the plug-in value.

  Measured (tests/diversity_test.py; N = 8, n = 8, 20k prompts): identical members at p = 0.1
  read plug-in 0.064, Miller–Madow 0.036, null 0.003.

  Args:
    counts: [N, P] integer successes, 0 <= c <= n.
    n: samples per member and prompt.
    correction: one of JS_CORRECTIONS.

  Returns:
    [P] float64 estimates (the corrected ones may be slightly negative).
  """
  c = np.asarray(counts)
  if c.ndim != 2 or not np.issubdtype(c.dtype, np.integer):
    raise ValueError(
      f"js_success_from_counts: counts must be [members, prompts] ints, got {c.dtype} {c.shape}."
    )
  if int(n) < 1 or np.any(c < 0) or np.any(c > n):
    raise ValueError(f"js_success_from_counts: need n >= 1 and 0 <= counts <= n (n={n}).")
  if correction not in JS_CORRECTIONS:
    raise ValueError(f"js_success_from_counts: correction={correction!r}; use {JS_CORRECTIONS}.")
  n = int(n)
  members = c.shape[0]
  pooled = c.sum(axis=0)  # [P]
  p_bar = pooled / (members * n)
  js = np.asarray(js_success_diversity(c / n, average=False), np.float64)
  if correction == "null":
    js = js - (expected_binary_entropy(members * n, p_bar) - expected_binary_entropy(n, p_bar))
  elif correction == "miller_madow":
    js = js + ((pooled > 0) & (pooled < members * n)) / (2.0 * members * n)
    js = js - np.mean((c > 0) & (c < n), axis=0) / (2.0 * n)
  return js


class Interval(NamedTuple):
  """A mean and its bootstrap percentile interval."""

  mean: float
  low: float
  high: float


def bootstrap_ci(
  values: Any, *, num_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> Interval:
  """Mean of per-prompt values with a percentile bootstrap interval (prompts resampled).

  Args:
    values: [P] per-prompt values (NaNs are an error: they would hide prompts).
    num_resamples: bootstrap resamples.
    level: coverage of the interval, in (0, 1).
    seed: NumPy seed of the resampling (the interval is a fixed function of it).
  """
  v = np.asarray(values, np.float64).reshape(-1)
  if v.size == 0 or not np.all(np.isfinite(v)):
    raise ValueError(f"bootstrap_ci: need finite values for at least one prompt, got {v.size}.")
  if not 0 < level < 1 or int(num_resamples) < 1:
    raise ValueError(f"bootstrap_ci: level={level} must be in (0, 1), num_resamples >= 1.")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, v.size, size=(int(num_resamples), v.size))
  means = v[idx].mean(axis=1)
  tail = (1.0 - level) / 2.0
  low, high = np.quantile(means, [tail, 1.0 - tail])
  return Interval(float(v.mean()), float(low), float(high))


def js_policy_diversity(loglik: jax.Array) -> jax.Array:
  """Monte-Carlo estimate of the policy Jensen–Shannon diversity on sequences.

    JS_pol = H(π̄) − (1/N) Σ_i H(π_i),   π̄ = (1/N) Σ_i π_i,

  with S sequences y_{j,s} ~ π_j per member and ll[i, j, s] = log π_i(y_{j,s}):

    H(π_i) ≈ −(1/S) Σ_s ll[i, i, s]
    H(π̄)  ≈ −(1/(N S)) Σ_{j,s} [logsumexp_i ll[i, j, s] − log N]

  (the N·S sequences are a stratified sample of π̄). Unbiased for both entropies; the estimate
  can be slightly negative when the members nearly coincide.

  Args:
    loglik: [..., N, N, S] sequence log-likelihoods (scoring member first, sampling member
      second); leading axes (e.g. prompts) are kept.

  Returns:
    [...] float32 estimate in nats.
  """
  ll = jnp.asarray(loglik, jnp.float32)
  if ll.ndim < 3 or ll.shape[-3] != ll.shape[-2]:
    raise ValueError(
      f"js_policy_diversity: loglik must be [..., N, N, S] (scoring member, sampling member, "
      f"samples), got shape {ll.shape}."
    )
  n = ll.shape[-3]
  own = jnp.diagonal(ll, axis1=-3, axis2=-2)  # [..., S, N]
  member_entropy = -own.mean(axis=(-2, -1))
  log_mixture = jax.nn.logsumexp(ll, axis=-3) - jnp.log(n)  # [..., N, S]
  mixture_entropy = -log_mixture.mean(axis=(-2, -1))
  return mixture_entropy - member_entropy


# ---------------------------------------------------------------------------------------------
# Token entropy, drift, sparsity (docs/method.md §7)


def _leaves_pair(params: Any, base: Any, name: str) -> tuple[list, list]:
  leaves, treedef = jax.tree_util.tree_flatten(params)
  base_leaves, base_treedef = jax.tree_util.tree_flatten(base)
  if treedef != base_treedef:
    raise ValueError(
      f"{name}: the parameter trees differ in structure: {treedef} vs {base_treedef}."
    )
  for a, b in zip(leaves, base_leaves, strict=True):
    if jnp.shape(a) != jnp.shape(b):
      raise ValueError(f"{name}: leaf shapes differ: {jnp.shape(a)} vs {jnp.shape(b)}.")
  return leaves, base_leaves


def relative_drift(params: Any, base: Any) -> jax.Array:
  """Relative parameter drift ‖θ − θ₀‖₂ / ‖θ₀‖₂ over all leaves (docs/method.md §7), in float32."""
  leaves, base_leaves = _leaves_pair(params, base, "relative_drift")
  diff_sq = sum(
    jnp.sum(jnp.square(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32)))
    for a, b in zip(leaves, base_leaves, strict=True)
  )
  base_sq = sum(jnp.sum(jnp.square(jnp.asarray(b, jnp.float32))) for b in base_leaves)
  return jnp.sqrt(diff_sq) / jnp.sqrt(base_sq)


def null_drift(
  alpha: float, num_params: int, steps: int, population_size: int, base_norm: float
) -> float:
  """The relative drift of ES with z-scored fitness that carries no signal (docs/method.md §7).

  One SGD step is ``(α/N) Σ_i z_i ε_i`` with ``Σ_i z_i² = N`` (z-scores, population std) and
  ``ε_i ~ N(0, I_D)`` independent, so its expected squared norm is ``α² D / N``; ``T``
  independent steps add up to ``α² D T / N``. Hence

    drift ≈ α · sqrt(D · T / N) / ‖θ₀‖,

  whatever the fitness, as long as it is not constant (a constant-fitness step has z = 0).
  Antithetic pairs and low-rank noise keep the same expectation per coordinate.

  Args:
    alpha: the learning rate α (SGD).
    num_params: ``D``, the number of perturbed parameters.
    steps: ``T``, the steps whose fitness was not constant.
    population_size: ``N``.
    base_norm: ``‖θ₀‖₂``.
  """
  return float(alpha * math.sqrt(num_params * steps / population_size) / base_norm)


def update_sparsity(delta: Any, tau: float) -> jax.Array:
  """Fraction of changed coordinates that thresholding at τ would reset (docs/method.md §7).

    s_τ = |{0 < |Δθ| ≤ τ}| / |{|Δθ| > 0}|,   0 when nothing changed.

  Args:
    delta: pytree of Δθ = θ_tuned − θ_base.
    tau: threshold τ ≥ 0.
  """
  small = changed = jnp.float32(0.0)
  for d in jax.tree_util.tree_leaves(delta):
    a = jnp.abs(jnp.asarray(d, jnp.float32))
    # Per-leaf int32 counts (a leaf holds < 2^31 entries), summed across leaves in float32.
    changed += jnp.sum(a > 0).astype(jnp.float32)
    small += jnp.sum((a > 0) & (a <= tau)).astype(jnp.float32)
  return jnp.where(changed > 0, small / jnp.maximum(changed, 1.0), 0.0)


def threshold_update(base: Any, tuned: Any, tau: float) -> Any:
  """Reset every coordinate whose update is small, 0 < |θ_tuned − θ_base| ≤ τ, to its base value.

  Args:
    base: base parameter pytree θ₀.
    tuned: tuned parameter pytree θ (same structure and shapes).
    tau: threshold τ ≥ 0.

  Returns:
    A pytree like `tuned` (its dtypes) with the small updates undone.
  """
  _leaves_pair(tuned, base, "threshold_update")

  def reset(b, t):
    t = jnp.asarray(t)
    a = jnp.abs(t.astype(jnp.float32) - jnp.asarray(b).astype(jnp.float32))
    return jnp.where((a > 0) & (a <= tau), jnp.asarray(b).astype(t.dtype), t)

  return jax.tree_util.tree_map(reset, base, tuned)
