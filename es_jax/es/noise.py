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

* full rank: ``eps``, iid N(0, 1) from ``key_il``, drawn in blocks of the flattened leaf
  (``es_jax.es.noise_blocks``: the block layout is part of the noise definition).
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
(sampling, perturbation, the update in ``es_jax.es.gradient``, the model hook in ``members``)
iterates it, so evaluation and update noise agree. ``STACKED_PREFIXES`` is the layout convention
of es_jax parameter pytrees (``es_jax.models.transformer`` stacks its layers under ``"layers"``);
which matrices the model's low-rank hook takes is declared by the model
(``transformer.is_hook_leaf``).

What a population draws is one ``NoiseSpec`` (size, antithetic, rank, low-rank vectors,
precision): every function here that draws or applies noise takes it whole, so evaluation
(``members.member``) and update (``gradient.es_gradient``) cannot disagree on it.

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

from es_jax import _checks
from es_jax.es.noise_blocks import block_normal, leaf_normal, map_noise_blocks, normal

PRECISIONS = ("fp32", "bf16_faithful")
# In-place bf16 ES schemes a NoiseSpec may also ask for (es_jax.es.reference_arithmetic: Qiu et
# al.'s shape-shared noise, the understanding-es reproduction's per-tensor noise; full rank only).
IN_PLACE_PRECISIONS = ("bf16_shared_noise", "bf16_tensor_noise")
SPEC_PRECISIONS = (*PRECISIONS, *IN_PLACE_PRECISIONS)
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

  ``path`` as from ``jax.tree_util.tree_flatten_with_path`` or plain keys (``("layers", "wq")``;
  ``()`` for none). Under a key in ``STACKED_PREFIXES`` (one leading layer axis): ``ndim >= 3``;
  any other leaf: ``ndim >= 2``.
  """
  return len(shape) >= (3 if is_stacked_leaf(path) else 2)


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
  """The noise of one ES population, shared by its evaluation and its update.

  Evaluation (``members.member``, ``population.evaluate_population``) draws member ``i``'s noise
  from it and ``es.es_gradient`` regenerates the same noise from it; every noise function takes
  it whole, so one spec passed to both is what keeps evaluation and update in agreement. Frozen
  and hashable: a static argument of jitted code. Validated once, on construction.

  Args:
    population_size: ``N``, a positive Python int (static).
    antithetic: members ``2j``, ``2j + 1`` use ``+ε_j`` and ``-ε_j`` (``N`` must be even).
    rank: None (full rank) or the EGGROLL rank ``r >= 1``.
    low_rank_vectors: ``"full"`` or ``"frozen"`` (zeros) noise for vector leaves
      (``is_matrix_leaf`` false) in low rank.
    precision: the member arithmetic of evaluation: ``"fp32"``, ``"bf16_faithful"`` (full rank
      only; see ``apply_noise``) or one of ``IN_PLACE_PRECISIONS``
      (``members.perturb_member``; full rank, not antithetic). ``es_gradient``'s
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
    n = _checks.positive_int(self.population_size, "population_size")
    if self.antithetic and n % 2:
      raise ValueError(
        f"population_size={n} is odd but antithetic=True pairs members (2j, 2j+1): "
        "use an even population size."
      )
    rank, vectors, precision = self.rank, self.low_rank_vectors, self.precision
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
      raise ValueError(f"rank={rank!r} is invalid: pass a positive int for low-rank noise or None.")
    if vectors not in LOW_RANK_VECTORS:
      raise ValueError(f"low_rank_vectors={vectors!r} is invalid: use one of {LOW_RANK_VECTORS}.")
    if precision not in SPEC_PRECISIONS:
      raise ValueError(f"precision={precision!r} is invalid: use one of {SPEC_PRECISIONS}.")
    if precision in IN_PLACE_PRECISIONS and self.antithetic:
      raise ValueError(f"precision={precision!r} draws one noise per member: use antithetic=False.")
    if self.rank is not None and precision != "fp32":
      raise ValueError(
        f"precision={precision!r} needs materialised weights; low-rank members "
        f"(rank={self.rank}) go through the model hook: use precision='fp32' or rank=None."
      )


def as_noise_spec(spec: Any, where: str) -> NoiseSpec:
  """``spec`` if it is a ``NoiseSpec``; else a TypeError saying ``where`` needs one."""
  if not isinstance(spec, NoiseSpec):
    raise TypeError(
      f"{where} takes a noise.NoiseSpec(population_size, antithetic=, rank=, low_rank_vectors=, "
      f"precision=), got {spec!r}."
    )
  return spec


class Leaf(NamedTuple):
  """One parameter leaf as the noise sees it (an entry of ``leaf_plan``)."""

  index: int  # position in the stable leaf order: its noise key is leaf_key(member_key, index)
  names: tuple[Any, ...]  # the path as plain names, e.g. ("layers", "wq")
  shape: tuple[int, ...]
  kind: str  # "dense", "low_rank" or "frozen" (noise_kind)


def leaf_plan(params: Any, spec: NoiseSpec) -> tuple[list[Leaf], list[Any], Any]:
  """The one walk over the parameter leaves: which leaf is which, and what noise each gets.

  Sampling (``sample_noise``), perturbation (``perturb``), the update
  (``es.es_update_direction``) and the model's low-rank hook (``members.member``) all iterate
  this plan, so they agree on the leaf order and on the matrix/vector rule (``is_matrix_leaf``).

  Args:
    params: parameter pytree (dict, ``nnx.State``, ...; only leaf shapes are read).
    spec: the population's ``NoiseSpec`` (its ``rank`` and ``low_rank_vectors`` are read).

  Returns:
    ``(plan, values, treedef)``: a ``Leaf`` per leaf in the stable order, the leaves themselves
    in that order, and the treedef that rebuilds a pytree like ``params`` from such a list.
  """
  spec = as_noise_spec(spec, "noise.leaf_plan")
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  plan = []
  for l, (path, x) in enumerate(paths_leaves):
    shape = tuple(int(d) for d in jnp.shape(x))
    kind = noise_kind(
      shape,
      rank=spec.rank,
      low_rank_vectors=spec.low_rank_vectors,
      is_matrix=is_matrix_leaf(path, shape),
    )
    plan.append(Leaf(l, path_names(path), shape, kind))
  return plan, [x for _, x in paths_leaves], treedef


def member_key(step_key: jax.Array, i: int | jax.Array) -> jax.Array:
  """Key of population member ``i``: ``fold_in(step_key, i)``. ``i`` may be traced."""
  return jax.random.fold_in(step_key, i)


def member_key_and_sign(
  step_key: jax.Array, i: int | jax.Array, spec: NoiseSpec
) -> tuple[jax.Array, jax.Array]:
  """Noise key and sign of member ``i`` (``i`` may be traced): ``(member_key(step_key, i), 1)``,
  or with ``spec.antithetic`` members ``2j`` and ``2j + 1`` share ``member_key(step_key, j)`` with
  signs ``+1`` and ``-1``. The sign is a float32 scalar."""
  if not as_noise_spec(spec, "noise.member_key_and_sign").antithetic:
    return member_key(step_key, i), jnp.float32(1.0)
  sign = 1.0 - 2.0 * jnp.asarray(i % 2, jnp.float32)
  return member_key(step_key, i // 2), sign


def leaf_key(key: jax.Array, leaf_index: int) -> jax.Array:
  """Key of leaf ``leaf_index`` (stable leaf order) from a member key: ``fold_in(key, l)``."""
  return jax.random.fold_in(key, leaf_index)


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
    return normal(key_leaf, shape)
  if kind == "frozen":
    return jnp.zeros(shape, jnp.float32)
  *lead, m, n = shape
  key_a, key_b = jax.random.split(key_leaf)
  a = normal(key_a, (*lead, m, rank))  # [..., m, r]
  b = normal(key_b, (*lead, n, rank))  # [..., n, r]
  return LowRankNoise(a, b)


def sample_noise(params: Any, key: jax.Array, spec: NoiseSpec) -> Any:
  """Noise for every leaf of ``params`` (only shapes are read) from one member key
  (``member_key(step_key, i)``), under ``spec``: float32 N(0, 1) arrays in full rank; in low rank
  ``LowRankNoise(a, b)`` (``a @ b^T / sqrt(r)``) for matrix leaves and full noise or zeros
  (``spec.low_rank_vectors``) for vector leaves. A pytree with the structure of ``params``."""
  plan, _, treedef = leaf_plan(params, spec)
  return treedef.unflatten([_plan_noise(key, leaf, spec.rank) for leaf in plan])


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


def member_noise(params: Any, step_key: jax.Array, i: int | jax.Array, spec: NoiseSpec) -> Any:
  """Noise ``ε_i`` of population member ``i`` under ``spec`` (antithetic sign applied); ``i`` may
  be traced.

  Evaluation (``members.member``) and the ES update (``es.es_gradient``) both go through this
  function's pieces (``member_key_and_sign`` and ``leaf_noise``), so they see identical noise.
  """
  key, sign = member_key_and_sign(step_key, i, spec)
  noise = sample_noise(params, key, spec)
  return noise if not spec.antithetic else scale_noise(noise, sign)


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
  if precision not in PRECISIONS:
    raise ValueError(f"precision={precision!r} is invalid: use one of {PRECISIONS}.")
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
  params: Any, key: jax.Array, sigma: float | jax.Array, spec: NoiseSpec, *, sharded: bool = False
) -> Any:
  """``θ + σ ε`` with ``ε = sample_noise(params, key, spec)``, in the params' dtypes, with
  ``spec.precision``'s arithmetic (``apply_noise``; the in-place modes are
  ``members.perturb_member``'s).

  Full-rank (dense) noise is added block by block as it is drawn (``map_noise_blocks``): besides
  the result, memory is ``O(NOISE_BLOCK)``. With ``sharded=True`` (params split over a mesh axis)
  it is drawn in each leaf's layout instead (``leaf_normal``), so every device draws only its
  shard's entries; the same numbers. Low-rank noise is materialised here: use it for small
  models, tests and references; large models consume ``LowRankNoise`` inside the forward pass
  instead (``members.member``).
  """
  spec = as_noise_spec(spec, "noise.perturb")
  precision = spec.precision
  if precision not in PRECISIONS:
    raise ValueError(
      f"noise.perturb: precision={precision!r} is an in-place mode with its own noise: "
      "build the member with es_jax.es.members.perturb_member (or members.member)."
    )
  sigma = jnp.asarray(sigma, jnp.float32)
  plan, values, treedef = leaf_plan(params, spec)
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
      out.append(_add_leaf(p, materialize(_plan_noise(key, leaf, spec.rank)), sigma, precision))
  return treedef.unflatten(out)
