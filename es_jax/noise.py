"""Key-regenerated Gaussian noise for Evolution Strategies (full rank and EGGROLL low rank).

Noise is never stored: it is a pure function of (key, leaf index, leaf shape, options), so the
exact same noise is produced when a member is evaluated and when the update is formed.

Key derivation (nothing random is stored)::

  step_key = fold_in(run_key, step)
  key_i    = member_key(step_key, i)    = fold_in(step_key, i)
  key_il   = fold_in(key_i, l)          # l: the leaf index below

Stable leaf order: leaf ``l`` is the ``l``-th entry of
``jax.tree_util.tree_leaves_with_path(params)`` (the same order as ``jax.tree.leaves``: dict and
``nnx.State`` keys sorted, sequences in order). Adding or removing a parameter shifts the indices
of the leaves after it.

Per leaf of shape ``s`` (float32 always, whatever the parameter dtype):

* full rank: ``eps``, iid N(0, 1), drawn in blocks of the flattened leaf (``n`` entries,
  ``B = min(NOISE_BLOCK, n)``, ``nb = ceil(n / B)`` blocks): block ``b`` is
  ``jax.random.normal(fold_in(key_il, b), (B,))`` placed at ``s_b = min(b B, n - B)``, and it
  supplies the entries from ``b B`` on (the last block, shifted back to fit, leaves the entries
  before ``b B`` to block ``b - 1``). Every entry comes from exactly one (block key, offset), so the
  entries stay iid. Blocks let every consumer (perturbation, the update's accumulation) work one
  block at a time: their memory is ``O(NOISE_BLOCK)``, never a noise array the size of a leaf.
* low rank ``r`` (EGGROLL, arXiv 2511.16652), matrix leaves (``is_matrix_leaf`` below): the last
  two dims are the matrix ``(m, n)`` and leading dims index independent matrices (a
  layer-stacked ``[L, m, n]`` weight gets independent factors per layer).
  ``key_a, key_b = jax.random.split(key_il)``, ``a = normal(key_a, [..., m, r])``,
  ``b = normal(key_b, [..., n, r])``, and the represented noise is ``E = a @ b^T / sqrt(r)``
  (every entry has variance 1). Vector leaves get full-rank noise (``low_rank_vectors="full"``,
  the same draw as full rank) or zeros (``"frozen"``).

Matrix or vector (``is_matrix_leaf(path, shape)``), decided from the leaf's path in the pytree:
a leaf under a top-level key in ``STACKED_PREFIXES`` (``"layers"``: the transformer's per-layer
tensors, stacked on a leading ``L`` axis) has one stack axis, so it is a matrix iff
``ndim >= 3`` (``layers/wq [L, m, n]``), and ``layers/attn_norm [L, D]`` or a bias
``layers/bq [L, n]`` is a stack of vectors. Any other leaf is a matrix iff ``ndim >= 2``
(``embed [V, D]``, ``lm_head [D, V]``, or ``w [m, n]`` of a generic pytree; ``final_norm [D]``
is a vector). ``leaf_plan`` is the one walk over the leaves that applies this rule; every consumer
(sampling, perturbation, the update in ``es_jax.es``, the model hook in ``es_jax.population``)
iterates it, so evaluation and update noise agree. ``STACKED_PREFIXES`` is the layout convention
of es_jax parameter pytrees (``es_jax.models.transformer`` stacks its layers under ``"layers"``);
which matrices the model's low-rank hook takes is declared by the model
(``transformer.is_hook_leaf``).

Antithetic sampling (``antithetic=True``): member ``i`` uses the noise of pair ``j = i // 2``, drawn
from ``member_key(step_key, j)``, with sign ``+1`` for even ``i`` and ``-1`` for odd ``i``.

Bit-identical regeneration holds between a Python loop, ``lax.scan``/``fori_loop`` and ``vmap`` over
members for the default threefry PRNG; other PRNG implementations (``rbg``) may differ under vmap.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

from es_jax import _checks

PRECISIONS = ("fp32", "bf16_faithful")
# In-place bf16 ES schemes a NoiseSpec may also ask for (es_jax.reference_arithmetic: Qiu et al.'s
# shape-shared noise, the understanding-es reproduction's per-tensor noise; full rank only).
IN_PLACE_PRECISIONS = ("bf16_shared_noise", "bf16_tensor_noise")
SPEC_PRECISIONS = (*PRECISIONS, *IN_PLACE_PRECISIONS)
# Entries per full-rank noise block (part of the noise definition: changing it changes the noise).
# 2^16 float32 = 256 KiB: the generator's working set stays in cache on CPU, and a 135M-parameter
# model is ~2k blocks, few enough loop steps for an accelerator.
NOISE_BLOCK = 2**16
LOW_RANK_VECTORS = ("full", "frozen")
# Top-level keys whose leaves carry one leading stack axis (the transformer's stacked layers).
STACKED_PREFIXES = ("layers",)


class LowRankNoise(NamedTuple):
  """Low-rank noise factors of one matrix leaf; the noise is ``a @ b^T / sqrt(r)``.

  A plain NamedTuple of two arrays so model code can consume it directly:
  ``x @ W + sigma * ((x @ a) @ b^T) / sqrt(r)``.
  """

  a: jax.Array  # [..., m, r]
  b: jax.Array  # [..., n, r]


def _is_low_rank(x: Any) -> bool:
  return isinstance(x, LowRankNoise)


def _key_name(k: Any) -> Any:
  """The name of one path entry: a ``DictKey``'s key, a ``GetAttrKey``'s name, a ``SequenceKey``'s
  index, or the entry itself (plain strings and ints)."""
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return getattr(k, attr)
  return k


def path_names(path: Sequence[Any]) -> tuple[Any, ...]:
  """A pytree path (``DictKey``, ``GetAttrKey``, ``SequenceKey`` or plain entries) as plain names,
  e.g. ``("layers", "wq")``."""
  return tuple(_key_name(k) for k in path)


def is_stacked_leaf(path: Sequence[Any]) -> bool:
  """Whether a leaf carries one leading layer axis: it sits under a key in ``STACKED_PREFIXES``."""
  return len(path) > 0 and _key_name(path[0]) in STACKED_PREFIXES


def is_matrix_leaf(path: Sequence[Any], shape: Sequence[int]) -> bool:
  """Whether a leaf gets low-rank (matrix) noise; the one rule every consumer shares.

  Args:
    path: the leaf's path, as from ``jax.tree_util.tree_flatten_with_path`` (``DictKey``,
      ``GetAttrKey``, ... entries) or plain keys such as ``("layers", "wq")``; ``()`` for none.
    shape: the leaf's shape.

  Returns:
    For a leaf under a top-level key in ``STACKED_PREFIXES`` (one leading layer axis):
    ``ndim >= 3``. For any other leaf: ``ndim >= 2``.
  """
  return len(shape) >= (3 if is_stacked_leaf(path) else 2)


class Leaf(NamedTuple):
  """One parameter leaf as the noise sees it (an entry of ``leaf_plan``)."""

  index: int  # position in the stable leaf order: its noise key is leaf_key(member_key, index)
  names: tuple[Any, ...]  # the path as plain names, e.g. ("layers", "wq")
  shape: tuple[int, ...]
  kind: str  # "dense", "low_rank" or "frozen" (noise_kind)


def leaf_plan(
  params: Any, *, rank: int | None = None, low_rank_vectors: str = "full"
) -> tuple[list[Leaf], list[Any], Any]:
  """The one walk over the parameter leaves: which leaf is which, and what noise each gets.

  Sampling (``sample_noise``), perturbation (``perturb``), the update
  (``es.es_update_direction``) and the model's low-rank hook (``population.low_rank_member``)
  all iterate this plan, so they agree on the leaf order and on the matrix/vector rule
  (``is_matrix_leaf``).

  Args:
    params: parameter pytree (dict, ``nnx.State``, ...; only leaf shapes are read).
    rank: None (full rank: every leaf ``"dense"``) or the EGGROLL rank.
    low_rank_vectors: in low rank, ``"full"`` (``"dense"``) or ``"frozen"`` for vector leaves.

  Returns:
    ``(plan, values, treedef)``: a ``Leaf`` per leaf in the stable order, the leaves themselves
    in that order, and the treedef that rebuilds a pytree like ``params`` from such a list.
  """
  validate_noise_options(rank=rank, low_rank_vectors=low_rank_vectors)
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  plan = []
  for l, (path, x) in enumerate(paths_leaves):
    shape = tuple(int(d) for d in jnp.shape(x))
    kind = noise_kind(
      shape, rank=rank, low_rank_vectors=low_rank_vectors, is_matrix=is_matrix_leaf(path, shape)
    )
    plan.append(Leaf(l, path_names(path), shape, kind))
  return plan, [x for _, x in paths_leaves], treedef


def validate_noise_options(*, rank: int | None, low_rank_vectors: str) -> None:
  """Raises ValueError for a bad ``rank`` or ``low_rank_vectors``."""
  if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
    raise ValueError(f"rank={rank!r} is invalid: pass a positive int for low-rank noise or None.")
  if low_rank_vectors not in LOW_RANK_VECTORS:
    raise ValueError(
      f"low_rank_vectors={low_rank_vectors!r} is invalid: use one of {LOW_RANK_VECTORS}."
    )


def validate_precision(precision: str) -> None:
  """Raises ValueError for a ``precision`` not in ``PRECISIONS``."""
  if precision not in PRECISIONS:
    raise ValueError(f"precision={precision!r} is invalid: use one of {PRECISIONS}.")


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
  """The noise of one ES population, shared by its evaluation and its update.

  ``population.evaluate_population`` (and ``population.population_completions``) draw member ``i``'s
  noise from it and ``es.es_gradient`` regenerates the same noise from it, so building one spec and
  passing it to both is what keeps evaluation and update in agreement. Frozen and hashable: a static
  argument of jitted code. Validated once, on construction; errors name the field.

  Args:
    population_size: ``N``, a positive Python int (static).
    antithetic: members ``2j``, ``2j + 1`` use ``+ε_j`` and ``-ε_j`` (``N`` must be even).
    rank: None (full rank) or the EGGROLL rank ``r >= 1``.
    low_rank_vectors: ``"full"`` or ``"frozen"`` (zeros) noise for vector leaves
      (``is_matrix_leaf`` false) in low rank.
    precision: the member arithmetic of evaluation: ``"fp32"``, ``"bf16_faithful"`` (full rank
      only; see ``apply_noise``) or one of ``IN_PLACE_PRECISIONS``
      (``es_jax.reference_arithmetic.perturb``; full rank, not antithetic). ``es_gradient``'s
      update direction is float32 whatever it is.

  Raises:
    ValueError: for a bad field or combination, naming the field(s).
  """

  population_size: int
  antithetic: bool = False
  rank: int | None = None
  low_rank_vectors: str = "full"
  precision: str = "fp32"

  def __post_init__(self):
    if not isinstance(self.antithetic, bool):
      raise ValueError(f"antithetic={self.antithetic!r} must be a bool.")
    validate_population(self.population_size, self.antithetic)
    validate_noise_options(rank=self.rank, low_rank_vectors=self.low_rank_vectors)
    precision = self.precision
    if precision not in SPEC_PRECISIONS:
      raise ValueError(f"precision={precision!r} is invalid: use one of {SPEC_PRECISIONS}.")
    if precision in IN_PLACE_PRECISIONS and self.antithetic:
      raise ValueError(f"precision={precision!r} draws one noise per member: use antithetic=False.")
    if self.rank is not None and precision != "fp32":
      raise ValueError(
        f"precision={precision!r} needs materialised weights; low-rank members "
        f"(rank={self.rank}) go through the model hook: use precision='fp32' or rank=None."
      )


def validate_population(population_size: int, antithetic: bool) -> None:
  """Raises ValueError unless ``population_size`` is a positive Python int, even if antithetic."""
  n = _checks.positive_int(population_size, "population_size")
  if antithetic and n % 2:
    raise ValueError(
      f"population_size={n} is odd but antithetic=True pairs members (2j, 2j+1): "
      "use an even population size."
    )


def as_noise_spec(spec: Any, where: str) -> NoiseSpec:
  """``spec`` if it is a ``NoiseSpec``; else a TypeError saying ``where`` needs one."""
  if not isinstance(spec, NoiseSpec):
    raise TypeError(
      f"{where} takes a noise.NoiseSpec(population_size, antithetic=, rank=, low_rank_vectors=, "
      f"precision=), got {spec!r}."
    )
  return spec


def member_key(step_key: jax.Array, i: int | jax.Array) -> jax.Array:
  """Key of population member ``i``: ``fold_in(step_key, i)``. ``i`` may be traced."""
  return jax.random.fold_in(step_key, i)


def member_key_and_sign(
  step_key: jax.Array, i: int | jax.Array, *, antithetic: bool = False
) -> tuple[jax.Array, jax.Array]:
  """Noise key and sign of member ``i``.

  Args:
    step_key: key of this ES step.
    i: member index in ``[0, N)``; may be traced.
    antithetic: if True, members ``2j`` and ``2j + 1`` share ``member_key(step_key, j)`` with signs
      ``+1`` and ``-1``.

  Returns:
    ``(key, sign)`` with ``sign`` a float32 scalar.
  """
  if not antithetic:
    return member_key(step_key, i), jnp.float32(1.0)
  sign = 1.0 - 2.0 * jnp.asarray(i % 2, jnp.float32)
  return member_key(step_key, i // 2), sign


def leaf_key(key: jax.Array, leaf_index: int) -> jax.Array:
  """Key of leaf ``leaf_index`` (stable leaf order) from a member key: ``fold_in(key, l)``."""
  return jax.random.fold_in(key, leaf_index)


def block_normal(key: jax.Array, b: int | jax.Array, size: int) -> jax.Array:
  """Block ``b`` of the full-rank noise drawn from ``key`` (a leaf key): float32 ``[size]``.

  Drawn flat: a multi-dimensional draw makes XLA constant-fold the counter iotas, which took
  seconds to compile on CPU (jax 0.10, ``jax_threefry_partitionable``).
  """
  return jax.random.normal(jax.random.fold_in(key, b), (size,), jnp.float32)


def map_noise_blocks(flat: jax.Array, block_fn: Any) -> jax.Array:
  """Applies ``block_fn(b, values) -> new values`` to each noise block of a flat ``[n]`` array.

  The blocks are those of the full-rank noise (module docstring): ``values`` is the ``[B]``
  slice at ``s_b``, and only the entries that block ``b`` supplies are replaced, so the result
  combines ``flat`` with the noise entry by entry. Runs as a ``fori_loop`` updating ``flat`` in
  place: besides the result, memory is ``O(B)``. ``block_fn`` draws its noise with
  ``block_normal(leaf_key, b, B)``.
  """
  n = flat.shape[0]
  if n == 0:
    return flat
  size = min(NOISE_BLOCK, n)
  num_blocks = -(-n // size)
  if num_blocks == 1:
    return block_fn(0, flat)

  def body(b, out):
    start = jnp.minimum(b * size, n - size)
    values = jax.lax.dynamic_slice(out, (start,), (size,))
    new = block_fn(b, values)
    if n % size:  # the last block overlaps its predecessor: keep the entries it does not supply
      new = jnp.where(start + jnp.arange(size) < b * size, values, new)
    return jax.lax.dynamic_update_slice(out, new, (start,))

  return jax.lax.fori_loop(0, num_blocks, body, flat)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  """uint32 ``[*shape]``: each entry's row-major position in the flattened leaf, from iotas (so
  the SPMD partitioner computes only the entries of a device's shard)."""
  flat = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(range(len(shape))):
    flat = flat + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
    stride *= shape[d]
  return flat


def leaf_normal(key: jax.Array, shape: Sequence[int]) -> jax.Array:
  """The full-rank noise of a leaf from its leaf key, drawn entry by entry in the leaf's layout.

  Bit-identical to the block definition (module docstring) under the partitionable threefry
  PRNG (``jax_threefry_partitionable``, jax's default): there ``normal(k, (B,))[o]`` is
  ``sqrt(2) erfinv(u(threefry2x32(k, (0, o))))``, a function of the counter ``o`` alone, so
  entry ``f`` of the flattened leaf is that function at ``(fold_in(key, b(f)), f - s_b(f))``.
  Computed this way, no flattened copy of the leaf exists: under a parameter sharding (e.g.
  ``sharding.param_shardings`` over ``'model'``) every device draws only its own shard's entries,
  with no all-gather, and fused into its consumer (the perturbation or the update's accumulator)
  nothing larger than the leaf is materialised. Other PRNG implementations fall back to the
  blocks (``map_noise_blocks``).

  Args:
    key: the leaf key (``leaf_key(member_key, l)``).
    shape: the leaf's shape.

  Returns:
    float32 ``[*shape]``.
  """
  shape = tuple(int(d) for d in shape)
  n = math.prod(shape)
  if n == 0 or n >= 2**32 or not _counter_based(key):
    return _normal(key, shape)
  size = min(NOISE_BLOCK, n)
  num_blocks = -(-n // size)
  flat = _flat_index(shape)
  block = jnp.minimum(flat // jnp.uint32(size), jnp.uint32(num_blocks - 1))
  offset = flat - jnp.minimum(block * jnp.uint32(size), jnp.uint32(n - size))
  block_keys = jax.vmap(lambda b: jax.random.key_data(jax.random.fold_in(key, b)))(
    jnp.arange(num_blocks, dtype=jnp.uint32)
  )  # [nb, 2] uint32: the block keys of block_normal
  k = block_keys[block]  # [*shape, 2]
  hi, lo = threefry2x32_p.bind(k[..., 0], k[..., 1], jnp.zeros(shape, jnp.uint32), offset)
  bits = hi ^ lo  # jax.random.bits (32-bit, partitionable) at counter `offset`
  # jax.random.uniform(minval=nextafter(-1, 0), maxval=1), then sqrt(2) erfinv: jax.random.normal.
  mantissa = jax.lax.shift_right_logical(bits, jnp.uint32(32 - 23)) | jnp.uint32(0x3F800000)
  floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)
  lo_val = jnp.float32(np.nextafter(np.float32(-1.0), np.float32(0.0)))
  u = jax.lax.max(lo_val, floats * (jnp.float32(1.0) - lo_val) + lo_val)
  return jnp.float32(np.sqrt(2)) * jax.lax.erf_inv(u)


def _counter_based(key: jax.Array) -> bool:
  """Whether ``key`` draws as ``leaf_normal`` assumes: the threefry PRNG, partitionable mode."""
  if not jax.config.jax_threefry_partitionable:
    return False
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return str(jax.random.key_impl(key)) == "threefry2x32"
  return key.shape == (2,) and key.dtype == jnp.uint32  # raw uint32[2] keys are threefry


def _normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """float32 N(0, 1) of ``shape``: the full-rank noise of a leaf from its leaf key."""
  n = math.prod(shape)
  return map_noise_blocks(
    jnp.zeros((n,), jnp.float32), lambda b, v: block_normal(key, b, v.shape[0])
  ).reshape(shape)


def noise_kind(
  shape: tuple[int, ...],
  *,
  rank: int | None = None,
  low_rank_vectors: str = "full",
  is_matrix: bool | None = None,
) -> str:
  """What noise a leaf gets: ``"dense"`` (full rank, or a vector in low rank), ``"low_rank"``
  (``LowRankNoise`` factors) or ``"frozen"`` (zeros). See ``leaf_noise`` for the arguments."""
  if rank is None:
    return "dense"
  if is_matrix is None:
    is_matrix = is_matrix_leaf((), shape)
  if is_matrix and len(shape) < 2:
    raise ValueError(f"is_matrix=True for a leaf of shape {shape}: a matrix needs ndim >= 2.")
  if is_matrix:
    return "low_rank"
  return "frozen" if low_rank_vectors == "frozen" else "dense"


def leaf_noise(
  key: jax.Array,
  leaf_index: int,
  shape: tuple[int, ...],
  *,
  rank: int | None = None,
  low_rank_vectors: str = "full",
  is_matrix: bool | None = None,
) -> jax.Array | LowRankNoise:
  """Noise of one leaf from a member key; the single primitive behind every noise in es_jax.

  Args:
    key: the member key (``member_key(step_key, i)``).
    leaf_index: position of the leaf in the stable leaf order (module docstring).
    shape: the leaf's shape.
    rank: None for full-rank noise, or the EGGROLL rank ``r``.
    low_rank_vectors: ``"full"`` or ``"frozen"`` (zeros) for vector leaves in low rank.
    is_matrix: whether the leaf is a matrix, ``is_matrix_leaf(path, shape)`` of its path. None
      means a leaf without a stack axis (``is_matrix_leaf((), shape)``, i.e. ``ndim >= 2``), which
      is wrong for the stacked vectors under ``STACKED_PREFIXES``: pass the decision there.

  Returns:
    A float32 array of ``shape``, or ``LowRankNoise`` for matrix leaves in low rank.
  """
  key_leaf = leaf_key(key, leaf_index)
  shape = tuple(shape)
  kind = noise_kind(shape, rank=rank, low_rank_vectors=low_rank_vectors, is_matrix=is_matrix)
  if kind == "dense":
    return _normal(key_leaf, shape)
  if kind == "frozen":
    return jnp.zeros(shape, jnp.float32)
  *lead, m, n = shape
  key_a, key_b = jax.random.split(key_leaf)
  a = _normal(key_a, (*lead, m, rank))  # [..., m, r]
  b = _normal(key_b, (*lead, n, rank))  # [..., n, r]
  return LowRankNoise(a, b)


def sample_noise(
  params: Any, key: jax.Array, *, rank: int | None = None, low_rank_vectors: str = "full"
) -> Any:
  """Noise for every leaf of ``params`` from one member key.

  Args:
    params: parameter pytree (only leaf shapes are used).
    key: the member key, ``member_key(step_key, i)``.
    rank: None for full rank (a pytree like ``params`` of float32 N(0, 1)), or the EGGROLL rank:
      matrix leaves become ``LowRankNoise(a, b)`` representing ``a @ b^T / sqrt(rank)``.
    low_rank_vectors: in low rank, ``"full"`` noise or ``"frozen"`` (zeros) for vector leaves
      (``is_matrix_leaf`` false).

  Returns:
    A pytree with the structure of ``params`` whose leaves are arrays or ``LowRankNoise``.
  """
  plan, _, treedef = leaf_plan(params, rank=rank, low_rank_vectors=low_rank_vectors)
  return treedef.unflatten([_plan_noise(key, leaf, rank) for leaf in plan])


def _plan_noise(key: jax.Array, leaf: Leaf, rank: int | None) -> jax.Array | LowRankNoise:
  """``leaf_noise`` for an entry of ``leaf_plan`` (its kind already decided)."""
  if leaf.kind == "frozen":
    return jnp.zeros(leaf.shape, jnp.float32)
  return leaf_noise(key, leaf.index, leaf.shape, rank=rank, is_matrix=leaf.kind == "low_rank")


def scale_noise(noise: Any, scale: float | jax.Array) -> Any:
  """Multiplies noise by a scalar; for ``LowRankNoise`` only ``a`` is scaled."""

  def _scale(x):
    if _is_low_rank(x):
      return LowRankNoise(x.a * scale, x.b)
    return x * scale

  return jax.tree.map(_scale, noise, is_leaf=_is_low_rank)


def member_noise(
  params: Any,
  step_key: jax.Array,
  i: int | jax.Array,
  *,
  antithetic: bool = False,
  rank: int | None = None,
  low_rank_vectors: str = "full",
) -> Any:
  """Noise of population member ``i`` (antithetic sign applied); ``i`` may be traced.

  Evaluation (``perturb_member``, the model's low-rank hook) and the ES update both go through
  this function's pieces (``member_key_and_sign`` and ``leaf_noise``), so they see identical noise.
  """
  key, sign = member_key_and_sign(step_key, i, antithetic=antithetic)
  noise = sample_noise(params, key, rank=rank, low_rank_vectors=low_rank_vectors)
  return noise if not antithetic else scale_noise(noise, sign)


def materialize(noise: Any) -> Any:
  """Dense float32 noise: ``LowRankNoise`` leaves become ``a @ b^T / sqrt(r)``; others unchanged.

  Costs ``m x n`` per matrix: for small models, tests and reference computations only.
  """

  def _dense(x):
    if _is_low_rank(x):
      r = x.a.shape[-1]
      prod = jnp.einsum("...mr,...nr->...mn", x.a, x.b, precision=jax.lax.Precision.HIGHEST)
      return prod / jnp.float32(math.sqrt(r))
    return jnp.asarray(x, jnp.float32)

  return jax.tree.map(_dense, noise, is_leaf=_is_low_rank)


def _round_to(x: jax.Array, dtype: Any) -> jax.Array:
  """Rounds float32 ``x`` to ``dtype``'s precision, staying float32.

  ``lax.reduce_precision`` is used rather than a cast pair because XLA may elide
  ``f32 -> bf16 -> f32`` converts (excess precision), which would break the faithful mode.
  """
  info = jnp.finfo(dtype)
  if info.bits >= 32:
    return x
  return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _add_leaf(p: jax.Array, e: jax.Array, sigma: jax.Array, precision: str) -> jax.Array:
  dtype = p.dtype
  p32 = p.astype(jnp.float32)
  if precision == "fp32":
    return (p32 + sigma * e).astype(dtype)
  # bf16_faithful: w.add_((sigma * randn_fp32).to(w.dtype)): sigma * noise in fp32 rounded once to
  # the weight dtype, then the sum in fp32 rounded to the weight dtype.
  return _round_to(p32 + _round_to(sigma * e, dtype), dtype).astype(dtype)


def apply_noise(
  params: Any, noise: Any, sigma: float | jax.Array, *, precision: str = "fp32"
) -> Any:
  """``params + sigma * noise`` in each leaf's dtype (low-rank leaves are materialised).

  Args:
    params: parameter pytree.
    noise: pytree from ``sample_noise``/``member_noise`` with the structure of ``params``.
    sigma: noise scale σ (a value, so changing it does not recompile).
    precision: ``"fp32"``: ``(float32(w) + σ ε)`` rounded once to the weight dtype (exact for fp32
      master weights). ``"bf16_faithful"``: an in-place bf16 step, float32 noise scaled and
      rounded once, ``round_w(w + round_w(σ ε))``, with ``round_w`` rounding to the weight dtype
      (docs/method.md §1), so bf16 drift figures compare like for like. Identical for fp32 weights.

  Returns:
    Perturbed params with the dtypes of ``params``.
  """
  validate_precision(precision)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  noise_leaves = treedef.flatten_up_to(noise)
  sigma = jnp.asarray(sigma, jnp.float32)
  out = []
  for p, e in zip(leaves, noise_leaves, strict=True):
    p = jnp.asarray(p)
    e = materialize(e)
    if e.shape != p.shape:
      raise ValueError(f"noise shape {e.shape} does not match parameter shape {p.shape}.")
    out.append(_add_leaf(p, e, sigma, precision))
  return treedef.unflatten(out)


def perturb(
  params: Any,
  key: jax.Array,
  sigma: float | jax.Array,
  *,
  rank: int | None = None,
  low_rank_vectors: str = "full",
  precision: str = "fp32",
  sharded: bool = False,
) -> Any:
  """``θ + σ ε`` with ``ε = sample_noise(params, key, ...)``, in the params' dtypes.

  Full-rank (dense) noise is added block by block as it is drawn (``map_noise_blocks``): besides
  the result, memory is ``O(NOISE_BLOCK)``. With ``sharded=True`` (params split over a mesh axis)
  it is drawn in each leaf's layout instead (``leaf_normal``), so every device draws only its
  shard's entries; the same numbers. Low-rank noise is materialised here: use it for small
  models, tests and references; large models consume ``LowRankNoise`` inside the forward pass
  instead. Equal to ``apply_noise(params, sample_noise(...), sigma)``; see it for ``precision``.
  """
  validate_precision(precision)
  sigma = jnp.asarray(sigma, jnp.float32)
  plan, values, treedef = leaf_plan(params, rank=rank, low_rank_vectors=low_rank_vectors)
  out = []
  for leaf, p in zip(plan, values, strict=True):
    p = jnp.asarray(p)
    key_leaf = leaf_key(key, leaf.index)
    if leaf.kind == "dense" and sharded:  # drawn in the leaf's layout: each device its shard
      out.append(_add_leaf(p, leaf_normal(key_leaf, p.shape), sigma, precision))
    elif leaf.kind == "dense":  # drawn and added one block at a time
      flat = map_noise_blocks(
        p.reshape(-1),
        lambda b, v, k=key_leaf: _add_leaf(v, block_normal(k, b, v.shape[0]), sigma, precision),
      )
      out.append(flat.reshape(p.shape))
    else:
      out.append(_add_leaf(p, materialize(_plan_noise(key, leaf, rank)), sigma, precision))
  return treedef.unflatten(out)


def perturb_member(
  params: Any,
  step_key: jax.Array,
  i: int | jax.Array,
  sigma: float | jax.Array,
  *,
  antithetic: bool = False,
  rank: int | None = None,
  low_rank_vectors: str = "full",
  precision: str = "fp32",
  sharded: bool = False,
) -> Any:
  """``θ + σ ε_i`` for population member ``i`` (``member_noise``); ``i`` may be traced/vmapped.

  Memory as ``perturb`` (the antithetic sign is folded into σ, which is exact).
  """
  key, sign = member_key_and_sign(step_key, i, antithetic=antithetic)
  return perturb(
    params,
    key,
    sign * jnp.asarray(sigma, jnp.float32),
    rank=rank,
    low_rank_vectors=low_rank_vectors,
    precision=precision,
    sharded=sharded,
  )
