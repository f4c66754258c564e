"""One member of an ES population, built from θ and its noise in each of its three ways.

Member ``i`` of a population under a ``noise.NoiseSpec`` (its noise ``ε_i`` is
``noise.member_noise(params, step_key, i, spec)``, the noise ``es.es_gradient`` regenerates):

* full rank (``spec.rank`` None, precision ``"fp32"`` or ``"bf16_faithful"``): the weights
  ``θ_i = θ + σ ε_i``, drawn and added block by block (``noise.perturb``).
* in-place bf16 arithmetic (``noise.IN_PLACE_PRECISIONS``): the weights ``round(w + round(σ ε_i))``
  with the mode's noise, as public PyTorch ES codes compute them (``reference_arithmetic.perturb``).
* low rank (EGGROLL, arXiv 2511.16652): the matrices the model's hook takes
  (``transformer.is_hook_leaf``) keep the shared base weight and pass their factors ``(a_i, b_i)``
  as ``forward(..., deltas=, delta_scale=σ/√r)``, i.e. ``x Wᵀ + (σ/√r)(x b_i) a_iᵀ``; every other
  leaf (norms, biases) is returned perturbed.

``member`` builds any of the three as a ``Member`` for the model; ``perturb_member`` returns plain
weights for any spec (low rank materialised, for small models, generic pytrees and references).
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from es_jax.es import noise as noise_lib
from es_jax.es import reference_arithmetic
from es_jax.es.member_axes import Member
from es_jax.models.transformer import is_hook_leaf


def _hooked(leaf: noise_lib.Leaf) -> bool:
  """Whether the model's low-rank hook (``forward(deltas=...)``) takes this leaf's noise: a
  low-rank matrix (``noise.leaf_plan``) that the model declares (``transformer.is_hook_leaf``).
  Vectors (norms, biases, stacked or not) never are: their noise is added to the weights."""
  return leaf.kind == "low_rank" and is_hook_leaf(leaf.names)


def member_owned_leaves(params: Any, spec: noise_lib.NoiseSpec) -> list[bool]:
  """Per leaf (stable order): whether each member holds its own copy of it. All leaves in full
  rank; in low rank all but the hook matrices, which stay shared and unbatched (``x @ W`` is one
  matmul for a whole chunk of members)."""
  plan, _, _ = noise_lib.leaf_plan(params, spec)
  return [not _hooked(leaf) for leaf in plan]


def perturb_member(
  params: Any,
  step_key: jax.Array,
  i: int | jax.Array,
  sigma: float | jax.Array,
  spec: noise_lib.NoiseSpec,
  *,
  sharded: bool = False,
) -> Any:
  """The weights ``θ + σ ε_i`` of member ``i`` (``i`` may be traced or vmapped) under ``spec``.

  Full rank: memory as ``noise.perturb`` (the antithetic sign is folded into σ, which is exact);
  the in-place modes: ``reference_arithmetic.perturb``; low rank: the factors materialised
  (``a @ b^T / sqrt(r)`` per matrix). ``sharded``: params split over a mesh axis, the dense
  noise drawn in each leaf's layout (the same numbers).
  """
  spec = noise_lib.as_noise_spec(spec, "members.perturb_member")
  if spec.precision in reference_arithmetic.MODES:
    key = noise_lib.member_key(step_key, i)
    return reference_arithmetic.perturb(params, key, sigma, mode=spec.precision, sharded=sharded)
  key, sign = noise_lib.member_key_and_sign(step_key, i, spec)
  return noise_lib.perturb(
    params, key, sign * jnp.asarray(sigma, jnp.float32), spec, sharded=sharded
  )


def _low_rank(
  params: Any, step_key: jax.Array, i: int | jax.Array, sigma: Any, spec: noise_lib.NoiseSpec
) -> Member:
  """Member ``i`` of a low-rank population through the model's hook (module docstring): hook
  matrices keep the base weight and pass their ``LowRankNoise`` (antithetic sign folded into
  ``a``), with ``delta_scale = σ / sqrt(r)``; all other leaves are returned perturbed."""
  nz = noise_lib.member_noise(params, step_key, i, spec)
  sigma = jnp.asarray(sigma, jnp.float32)
  plan, values, treedef = noise_lib.leaf_plan(params, spec)
  deltas: dict[str, Any] = {"layers": {}}
  out = []
  for leaf, p, e in zip(plan, values, treedef.flatten_up_to(nz), strict=True):
    if _hooked(leaf):
      if leaf.names[0] == "layers":
        deltas["layers"][leaf.names[1]] = e
      else:
        deltas[leaf.names[0]] = e
      out.append(p)
    else:
      out.append(noise_lib.apply_noise(p, e, sigma))
  return Member(treedef.unflatten(out), deltas, sigma / jnp.float32(math.sqrt(spec.rank)))


def member(
  params: Any,
  step_key: jax.Array,
  i: int | jax.Array,
  sigma: float | jax.Array,
  spec: noise_lib.NoiseSpec,
  *,
  sharded: bool = False,
) -> Member:
  """Member ``i`` of the population ``spec`` around ``params``, in the way ``spec`` asks for
  (module docstring): ``Member(θ_i, None, None)`` in full rank and the in-place modes
  (``perturb_member``), the base weights with the hook's factors in low rank. ``i`` may be traced.
  ``sharded``: params split over a mesh axis (full rank only; the same numbers)."""
  spec = noise_lib.as_noise_spec(spec, "members.member")
  if spec.rank is None:
    return Member(perturb_member(params, step_key, i, sigma, spec, sharded=sharded), None, None)
  return _low_rank(params, step_key, i, sigma, spec)
