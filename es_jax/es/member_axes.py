"""Members as the model takes them, and the member axes of `sampling.generate_members`: which
leaves of a `Member` (params, low-rank deltas, delta_scale) carry a leading member axis (in_axes
0) and which are shared (None); checking such a tree, its static (hashable) form, and unstacking
layer-stacked leaves under it."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class Member(NamedTuple):
  """A model as `forward(params, ..., deltas=deltas, delta_scale=delta_scale)` takes it: member
  ``i`` of an ES population computes the model at ``θ + σ ε_i`` (``es_jax.es.members``). Also the
  form of its member axes in `sampling.generate_members` (0 or None for each leaf)."""

  params: Any  # the member's weights (low rank: the base, vector leaves perturbed)
  deltas: dict[str, Any] | None = None  # low rank: LowRankNoise per hook matrix; else None
  delta_scale: jax.Array | None = None  # low rank: σ / sqrt(r); else None


def split_axes(axes):
  """A (hashable) static form of a vmap in_axes tree whose leaves are 0 or None."""
  leaves, treedef = jax.tree_util.tree_flatten(axes, is_leaf=lambda a: a is None)
  return tuple(leaves), treedef


def check_member_axes(name: str, tree, axes, members: int) -> None:
  """Raises ValueError unless `axes` gives 0 or None for every leaf (or subtree, as a vmap
  in_axes prefix) of `tree` and every array marked 0 has `members` rows."""
  if tree is None:
    return
  axes_paths, axes_def = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda a: a is None)
  try:
    subtrees = axes_def.flatten_up_to(tree)
  except (ValueError, TypeError) as e:
    raise ValueError(
      f"generate_members: {name}_axes must mirror {name} with 0 or None per leaf ({e})."
    ) from None
  for (path, a), sub in zip(axes_paths, subtrees, strict=True):
    where = f"{name}{jax.tree_util.keystr(path)}"
    if a is not None and (isinstance(a, bool) or a != 0):
      raise ValueError(f"generate_members: {name}_axes at {where} is {a!r}; use 0 or None.")
    for x in jax.tree.leaves(sub) if a == 0 else ():
      if jnp.ndim(x) == 0 or jnp.shape(x)[0] != members:
        raise ValueError(
          f"generate_members: {where} has shape {jnp.shape(x)} but is marked per member: its "
          f"leading axis must be the {members} members (len(keys))."
        )


def unstack_member_layers(tree, axes, num_layers: int):
  """`unstack_layers` for a tree whose per-member leaves (axes leaf 0) carry a leading member
  axis before the layer axis; shared leaves (axes leaf None) are sliced on their first axis.

  Returns the unstacked tree and its in_axes tree.
  """
  if tree is None or not isinstance(tree.get("layers"), dict):
    return tree, axes
  layers, layer_axes = tree["layers"], axes["layers"]

  def layer(i):
    take = lambda a, x: x[i] if a is None else x[:, i]  # noqa: E731
    return jax.tree.map(take, layer_axes, layers, is_leaf=lambda a: a is None)

  unstacked = tuple(layer(i) for i in range(num_layers))
  return {**tree, "layers": unstacked}, {**axes, "layers": (layer_axes,) * num_layers}
