"""Fitness shaping: the one place where rewards turn into ES weights.

Every function maps fitness (higher is better) to float32 weights ``w`` with ``sum(w) = 0`` (up
to rounding) that the ES update combines as ``(1/N) Σ_i w_i ε_i``. All are pure and jittable.

Conventions shared by all shapings:

* All fitness values equal: all weights are exactly zero (the ES step is a no-op).
* Non-finite fitness (NaN, +inf, -inf) ranks worst and never reaches the parameters: such a value
  is replaced by ``min_finite - gap``, where ``gap`` is the range ``max_finite - min_finite`` of
  the finite values (1.0 when they are all equal), before shaping. The affected member gets the
  lowest weight, the weights stay finite, and the step pushes away from it. If no value is finite
  the weights are all zero.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

ZSCORE_EPS = 1e-8


def replace_non_finite(r: jax.Array, axis: int | None = None) -> jax.Array:
  """Replaces non-finite entries by ``min_finite - gap`` along ``axis`` (module docstring).

  A slice with no finite value becomes all zeros (equal values, hence zero weights).
  """
  finite = jnp.isfinite(r)
  lo = jnp.min(jnp.where(finite, r, jnp.inf), axis=axis, keepdims=True)
  hi = jnp.max(jnp.where(finite, r, -jnp.inf), axis=axis, keepdims=True)
  any_finite = jnp.any(finite, axis=axis, keepdims=True)
  gap = jnp.where(hi > lo, hi - lo, 1.0)
  fill = jnp.where(any_finite, lo - gap, 0.0)
  return jnp.where(finite, r, fill)


def _as_float32(fitness: jax.Array, ndim: int, name: str) -> jax.Array:
  r = jnp.asarray(fitness)
  if r.ndim != ndim:
    want = "[N]" if ndim == 1 else "[N, P] (members x prompts)"
    raise ValueError(f"{name} expects fitness of shape {want}, got shape {r.shape}.")
  return r.astype(jnp.float32)


def zscore(fitness: jax.Array) -> jax.Array:
  """Z-score shaping, the paper's (docs/method.md §1; Qiu et al., arXiv 2509.24372).

  ``z_i = (R_i - mean(R)) / (std(R) + 1e-8)`` with the population std (ddof 0).

  Args:
    fitness: ``[N]`` fitness values ``R``.

  Returns:
    ``[N]`` float32 weights; zeros if all ``R_i`` are equal.
  """
  r = replace_non_finite(_as_float32(fitness, 1, "zscore"))
  centred = r - jnp.mean(r)
  z = centred / (jnp.std(r) + ZSCORE_EPS)
  # Equal values can leave a rounding residue in `centred` that the tiny std would amplify.
  return jnp.where(jnp.max(r) == jnp.min(r), 0.0, z)


def centered_rank(fitness: jax.Array) -> jax.Array:
  """Centred-rank shaping (Salimans et al. 2017, arXiv 1703.03864).

  ``w_i = rank_i / (N - 1) - 1/2`` in ``[-1/2, 1/2]``, ``rank_i`` the 0-based ascending rank;
  tied values share their average rank, so equal fitness gives equal weights. Costs ``O(N^2)``
  comparisons, negligible for population sizes.

  Args:
    fitness: ``[N]`` fitness values.

  Returns:
    ``[N]`` float32 weights; zeros if all values are equal or ``N == 1``.
  """
  r = _as_float32(fitness, 1, "centered_rank")
  n = r.shape[0]
  if n == 1:
    return jnp.zeros((1,), jnp.float32)
  r = jnp.where(jnp.isfinite(r), r, -jnp.inf)  # every non-finite value ties for the worst rank
  less = jnp.sum(r[None, :] < r[:, None], axis=1)  # [N] members strictly worse than i
  equal = jnp.sum(r[None, :] == r[:, None], axis=1)  # [N] ties, i included
  # 2 rank_i - (N - 1) is an exact integer: ties at the median give exactly 0.
  twice_centred = (2 * less + equal - 1 - (n - 1)).astype(jnp.float32)
  return twice_centred / jnp.float32(2 * (n - 1))


def per_prompt_zscore(fitness: jax.Array) -> jax.Array:
  """Per-prompt z-score (EGGROLL, arXiv 2511.16652): centre per prompt, scale by the global std.

  With ``R`` of shape ``[N, P]`` (member i's reward on prompt p):
  ``C_ip = R_ip - mean_i(R_ip)``, ``s = sqrt(mean_ip(C_ip^2))`` (population std of ``C``), and
  ``w_i = mean_p(C_ip) / (s + 1e-8)``. Centring per prompt removes prompt difficulty from the
  comparison; the single global scale keeps easy and hard prompts on one footing.

  Args:
    fitness: ``[N, P]`` per-member, per-prompt rewards.

  Returns:
    ``[N]`` float32 weights; zeros if every prompt column is constant. Non-finite entries are
    replaced per prompt column by that column's ``min_finite - gap``.
  """
  r = replace_non_finite(_as_float32(fitness, 2, "per_prompt_zscore"), axis=0)
  centred = r - jnp.mean(r, axis=0, keepdims=True)  # [N, P]
  constant = jnp.max(r, axis=0, keepdims=True) == jnp.min(r, axis=0, keepdims=True)  # [1, P]
  centred = jnp.where(constant, 0.0, centred)
  scale = jnp.sqrt(jnp.mean(jnp.square(centred))) + ZSCORE_EPS
  return jnp.mean(centred, axis=1) / scale


def coverage(fitness: jax.Array) -> jax.Array:
  """Coverage-targeted shaping (fitness sharing over prompts; not in the paper).

  A member's reward on prompt x is shared with the other members that also solve x::

    C_i = (1/P) Σ_x r_ix / (1 + Σ_{j≠i} max(r_jx, 0)),      w = zscore(C)

  With 0/1 rewards a success counts 1 / (1 + the other members' successes on x): solving a prompt
  the rest of the population misses is worth a full point, one everybody solves about 1/N. The
  update therefore favours directions that widen the set of solved prompts (what Pass@k rewards)
  over ones that re-solve the easy prompts. Graded rewards (e.g. 0.1 format credit) are shared
  the same way.

  Args:
    fitness: ``[N, P]`` per-member, per-prompt rewards.

  Returns:
    ``[N]`` float32 weights (``zscore`` of ``C``); zeros if all ``C_i`` are equal. Non-finite
    entries are replaced per prompt column as in ``per_prompt_zscore``.
  """
  r = replace_non_finite(_as_float32(fitness, 2, "coverage"), axis=0)
  solved = jnp.maximum(r, 0.0)
  others = jnp.sum(solved, axis=0, keepdims=True) - solved  # [N, P] the other members' sum
  return zscore(jnp.mean(r / (1.0 + others), axis=1))


# fold_in data of the null control's permutation key: far above any member index fold_in(key, i).
SHUFFLE_TAG = 0x7FFFFFFF


def shuffled(fitness: jax.Array, key: jax.Array) -> jax.Array:
  """The null-ES control: z-scores of the fitness permuted across members (docs/method.md §7).

  ``w = zscore(R[π])`` with ``π`` a uniform random permutation drawn from
  ``fold_in(key, SHUFFLE_TAG)``, ``key`` the step key. Each step's weights have the same
  distribution of values as ``zscore`` (hence the same expected drift,
  ``α·sqrt(D·T/N)/‖θ₀‖`` with SGD), but they are independent of which member earned which
  fitness, so the update carries no signal. Comparing a run with this shaping against a
  ``zscore`` run at the same settings separates what ES learned from its random walk.

  Args:
    fitness: ``[N]`` fitness values.
    key: the step key (the one the members' noise was drawn from).

  Returns:
    ``[N]`` float32 weights; zeros if all values are equal.
  """
  r = _as_float32(fitness, 1, "shuffled")
  perm = jax.random.permutation(jax.random.fold_in(key, SHUFFLE_TAG), r.shape[0])
  return zscore(r[perm])


SHAPINGS = {
  "zscore": zscore,
  "centered_rank": centered_rank,
  "per_prompt_zscore": per_prompt_zscore,
  "coverage": coverage,
  "shuffled": shuffled,
}
PER_PROMPT_SHAPINGS = ("per_prompt_zscore", "coverage")  # these take [N, P] rewards
KEYED_SHAPINGS = ("shuffled",)  # these also take the step key


def get_shaping(name: str):
  """The shaping function called ``name`` (one of ``SHAPINGS``)."""
  if name not in SHAPINGS:
    raise ValueError(f"shaping={name!r} is unknown: use one of {sorted(SHAPINGS)} or a callable.")
  return SHAPINGS[name]


def is_per_prompt(shaping: str | Callable[[jax.Array], jax.Array]) -> bool:
  """Whether ``shaping`` takes ``[N, P]`` per-prompt rewards (``PER_PROMPT_SHAPINGS``) rather
  than ``[N]`` fitness (the other names, and callables)."""
  return isinstance(shaping, str) and shaping in PER_PROMPT_SHAPINGS


def shaping_input(shaping: str | Callable[[jax.Array], jax.Array], fitness: Any, rewards: Any):
  """What ``shaping`` is given: the ``[N, P]`` per-prompt ``rewards`` if ``is_per_prompt``, else
  the ``[N]`` ``fitness`` (the per-member mean reward)."""
  return rewards if is_per_prompt(shaping) else fitness


def validate_shaping(shaping: str | Callable[[jax.Array], jax.Array]) -> None:
  """Raises ValueError unless ``shaping`` is a known name or a callable."""
  if not callable(shaping):
    get_shaping(shaping)


def shape_fitness(
  fitness: jax.Array,
  *,
  population_size: int,
  shaping: str | Callable[[jax.Array], jax.Array] = "zscore",
  key: jax.Array | None = None,
) -> jax.Array:
  """Validated fitness -> ``[N]`` float32 weights, as ``es_gradient`` computes them.

  Args:
    fitness: ``[N]`` fitness, or ``[N, P]`` per-prompt rewards for the shapings in
      ``PER_PROMPT_SHAPINGS`` (``"per_prompt_zscore"``, ``"coverage"``).
    population_size: ``N``.
    shaping: a name in ``SHAPINGS`` or a callable ``fitness -> [N] weights``.
    key: the step key; needed by the shapings in ``KEYED_SHAPINGS`` (``"shuffled"``).

  Returns:
    ``[N]`` float32 weights. Non-finite weights (possible only from a custom callable) are zeroed,
    so NaN never reaches the parameters.
  """
  validate_shaping(shaping)
  shape_fn = shaping if callable(shaping) else get_shaping(shaping)
  per_prompt = is_per_prompt(shaping)
  r = jnp.asarray(fitness)
  expected = f"({population_size}, P)" if per_prompt else f"({population_size},)"
  if r.shape[:1] != (population_size,) or r.ndim != (2 if per_prompt else 1):
    raise ValueError(
      f"fitness has shape {r.shape}, expected {expected}: one value per member of "
      f"population_size={population_size} (shaping={shaping!r})."
    )
  if isinstance(shaping, str) and shaping in KEYED_SHAPINGS:
    if key is None:
      raise ValueError(f"shaping={shaping!r} needs the step key: pass key=.")
    w = jnp.asarray(shape_fn(r, key), jnp.float32)
  else:
    w = jnp.asarray(shape_fn(r), jnp.float32)
  if w.shape != (population_size,):
    raise ValueError(
      f"shaping={shaping!r} returned shape {w.shape}, expected ({population_size},)."
    )
  return jnp.where(jnp.isfinite(w), w, 0.0)
