"""Evolution Strategies as an optax gradient transformation.

The ES step of the paper (docs/method.md §1; Qiu et al., arXiv 2509.24372), with the noise
regenerated from keys (``es_jax.es.noise``) rather than stored::

  θ ← θ + (α / N) Σ_i w_i ε_i,      w = shaping(R),  ε_i the noise of member i

``es_gradient(spec).update`` returns ``-(1/N) Σ_i w_i ε_i`` (optax updates are added, and
``optax.sgd`` negates), so ``optax.chain(es_gradient(spec), optax.sgd(alpha))`` is exactly the step
above and any optax optimiser (adam, schedules, clipping) can follow it. As in the paper, 1/σ is
folded into the learning rate: ``α`` plays the role of ``α_textbook / σ``.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from es_jax.es import fitness as fitness_lib
from es_jax.es import noise as noise_lib
from es_jax.es import noise_blocks


class ESState(NamedTuple):
  """State of ``es_gradient``: the number of updates taken (for logging; the noise is keyed)."""

  count: jax.Array  # [] int32


def _matrix_direction(key_of, w_eff, leaf_index, shape, rank):
  """``Σ_j w_j a_j b_j^T / sqrt(r)`` for a matrix leaf, without materialising any ``a_j b_j^T``.

  The factors of all members are concatenated along the rank axis, weighted on the ``a`` side, and
  contracted in one matmul of inner size ``M r`` (EGGROLL, arXiv 2511.16652, docs/method.md §2);
  leading (layer) dims are batch dims. Memory ``O(M r (m + n))`` per matrix for the factors plus
  the output.
  """

  def factors(j):
    lr = noise_lib.leaf_noise(key_of(j), leaf_index, shape, rank=rank, is_matrix=True)
    return lr.a, lr.b

  # lax.map (a scan), not vmap: bit-identical to per-member calls for every PRNG implementation.
  a, b = jax.lax.map(factors, jnp.arange(w_eff.shape[0]))  # [M, ..., m, r], [M, ..., n, r]
  a = a * w_eff.reshape((-1,) + (1,) * (a.ndim - 1))
  out = jnp.einsum("j...mr,j...nr->...mn", a, b, precision=jax.lax.Precision.HIGHEST)
  return out / jnp.float32(math.sqrt(rank))


def _dense_direction(key_of, w_eff, leaf_index, shape, sharded):
  """``Σ_j w_j ε_j`` for one leaf with dense noise (any leaf in full rank, a vector leaf in low
  rank), each member's noise regenerated into an fp32 accumulator, members summed in order.

  Replicated parameters: block by block (``noise_blocks.map_noise_blocks``), memory the output
  plus one block. ``sharded``: the noise is drawn in the leaf's layout (``leaf_normal``), so
  under a parameter sharding every device draws and sums only its own shard's entries (a
  flattened leaf cannot be split like the leaf, and would be gathered). The same numbers.
  """
  if sharded:

    def add_member(j, acc):
      key_leaf = noise_lib.leaf_key(key_of(j), leaf_index)
      return acc + w_eff[j] * noise_blocks.leaf_normal(key_leaf, shape)

    return jax.lax.fori_loop(0, w_eff.shape[0], add_member, jnp.zeros(shape, jnp.float32))

  def block(b, acc):  # acc [B]: this block of the sum
    def member(j, acc):
      key_leaf = noise_lib.leaf_key(key_of(j), leaf_index)
      return acc + w_eff[j] * noise_blocks.block_normal(key_leaf, b, acc.shape[0])

    return jax.lax.fori_loop(0, w_eff.shape[0], member, acc)

  flat = noise_blocks.map_noise_blocks(jnp.zeros((math.prod(shape),), jnp.float32), block)
  return flat.reshape(shape)


def es_update_direction(
  params: Any,
  fitness_weights: jax.Array,
  step_key: jax.Array,
  spec: noise_lib.NoiseSpec,
  *,
  sharded: bool = False,
) -> Any:
  """``(1/N) Σ_i w_i ε_i`` in float32, a pytree like ``params``.

  ``ε_i`` is ``noise.member_noise(params, step_key, i, spec)`` (the noise member ``i`` was
  evaluated with), regenerated block by block and member by member: besides the output, memory
  is ``O(noise_blocks.NOISE_BLOCK)`` for full rank, never ``O(N x params)``. With
  ``spec.antithetic`` a pair shares its noise, so ``Σ_i w_i ε_i = Σ_j (w_{2j} - w_{2j+1}) ε_j``
  and only ``N/2`` draws are made. Low-rank matrices (``noise.is_matrix_leaf`` of the leaf's
  path, as for evaluation) are formed as one matmul of the concatenated, weighted factors.

  Args:
    params: parameter pytree (only shapes are used).
    fitness_weights: ``[N]`` shaped fitness ``w``.
    step_key: key of this ES step (the one the members were evaluated with).
    spec: the population's ``noise.NoiseSpec`` (the one the members were evaluated with): size
      ``N``, antithetic, rank, low-rank vectors.
    sharded: the parameters are split over a mesh axis (``sharding.param_shardings`` with
      ``model`` > 1): dense noise is drawn in each leaf's layout, on each device's shard only
      (``noise.leaf_normal``), instead of block by block over the flattened leaf. The same
      numbers either way; False keeps the update's memory at one block besides the output.

  Returns:
    The float32 direction; leaves frozen by ``low_rank_vectors="frozen"`` are zeros.
  """
  spec = noise_lib.as_noise_spec(spec, "es.es_update_direction")
  population_size, rank = spec.population_size, spec.rank
  w = jnp.asarray(fitness_weights, jnp.float32)
  if w.shape != (population_size,):
    raise ValueError(
      f"fitness_weights has shape {w.shape}, expected ({population_size},): one weight per "
      f"member of population_size={population_size}."
    )
  if spec.antithetic:
    w_eff = w[0::2] - w[1::2]  # [N/2], pair j: +ε_j for member 2j, -ε_j for member 2j+1
  else:
    w_eff = w  # [N]

  def key_of(j):
    return noise_lib.member_key(step_key, j)

  # The walk the evaluation noise was drawn with: same leaf order, same matrix/vector rule.
  plan, _, treedef = noise_lib.leaf_plan(params, spec)
  inv_n = jnp.float32(1.0 / population_size)
  out = []
  for leaf in plan:
    if leaf.kind == "low_rank":
      d = _matrix_direction(key_of, w_eff, leaf.index, leaf.shape, rank)
    elif leaf.kind == "frozen":
      d = jnp.zeros(leaf.shape, jnp.float32)
    else:
      d = _dense_direction(key_of, w_eff, leaf.index, leaf.shape, sharded)
    out.append(d * inv_n)
  return treedef.unflatten(out)


def es_gradient(
  spec: noise_lib.NoiseSpec,
  /,
  *,
  shaping: str | Callable[[jax.Array], jax.Array] = "zscore",
  sharded: bool = False,
) -> optax.GradientTransformationExtraArgs:
  """ES search direction as an optax transform (docs/method.md §1-2).

  ``update(updates, state, params, *, fitness, key)`` ignores ``updates`` and returns
  ``u = -(1/N) Σ_i w_i ε_i``, ``w = shaping(fitness)``, with ``ε_i`` member ``i``'s noise under
  ``spec`` regenerated from ``key`` (pass the spec and step key the population was evaluated
  with). Chained with ``optax.sgd(alpha)`` this is ``θ ← θ + (α/N) Σ_i w_i ε_i``, the paper's
  update with 1/σ folded into ``α`` (so there is no σ argument). Updates are float32 whatever the
  weights' dtype or ``spec.precision``; non-finite fitness ranks worst and non-finite custom
  weights are zeroed, so NaN never reaches the parameters.

  Args:
    spec: the population's ``noise.NoiseSpec``. Positional only.
    shaping: ``"zscore"`` (paper), ``"centered_rank"``, ``"per_prompt_zscore"`` or
      ``"coverage"`` (fitness ``[N, P]``), ``"shuffled"`` (the null control: z-scores permuted
      across members by ``key``), or a callable ``fitness -> [N] weights``.
    sharded: params split over a mesh axis; see ``es_update_direction`` (the same update).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with state ``ESState``; a TypeError if ``spec``
    is not a ``NoiseSpec``.
  """
  spec = noise_lib.as_noise_spec(spec, "es_gradient")
  population_size = spec.population_size
  fitness_lib.validate_shaping(shaping)

  def init_fn(params):
    del params
    return ESState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, fitness, key, **extra_args):
    del updates, extra_args
    if params is None:
      raise ValueError("es_gradient.update needs params (to regenerate the noise): pass params=.")
    w = fitness_lib.shape_fitness(
      fitness, population_size=population_size, shaping=shaping, key=key
    )
    direction = es_update_direction(params, w, key, spec, sharded=sharded)
    return jax.tree.map(jnp.negative, direction), ESState(count=state.count + 1)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
