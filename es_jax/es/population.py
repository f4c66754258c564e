"""Evaluating an ES population: perturbed members generate, the host scores, fitness comes back.

One ES evaluation (docs/method.md §1; docs/architecture.md, "Data flow")::

  for member i in [0, N):                    # chunks of M members, vmapped within a device,
    θ_i = θ + σ ε_i                          # chunks split over the mesh axis 'pop'
    completions_i = generate(θ_i, prompts)   # [P, T], the same prompts for every member
  host: rewards[i, p] = score_fn(tokens_i, mask_i)[p]       # [N, P]
  fitness R_i = mean_p rewards[i, p]                         # [N], rewards are maximised

Member ``i`` is ``es_jax.es.members.member(params, step_key, i, sigma, spec)``: its noise is
``noise.member_noise(params, step_key, i, spec)``, which the update
(``es_jax.es.gradient.es_gradient``)
regenerates from the same spec, so evaluation and update see identical noise. Nothing
random is stored and no ``[N, num_params]`` array exists. Within a chunk the noise is drawn one
member at a time (``lax.map``, like the update), so it stays bit-identical for every PRNG
implementation (``rbg`` draws differ under ``vmap``). A chunk's members then decode together
(``sampling.generate_members``): one decode loop over the chunk's ``M x P`` rows in which only the
model call is vmapped over members, so shared weights are one matmul for every row and the loop's
stopping test stays unbatched.

* Full rank (and the in-place bf16 modes): each member's weights are materialised inside its chunk
  only; device memory is ``O(params x (M + 1))``.
* Low rank (EGGROLL, arXiv 2511.16652): the members share the base matrices and pass their factors
  to the model's hook (``members.member``), so the ``x W`` matmul is one batched matmul for all
  members of a chunk.

Only completions (to be scored by a host verifier) leave the devices; on several hosts every
process scores the members on its own devices and only ``[N, P]`` rewards and ``[N]`` statistics
are exchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec

from es_jax import _checks
from es_jax.decode import sampling
from es_jax.devices import sharding as sharding_lib
from es_jax.es import members as members_lib
from es_jax.es import noise as noise_lib
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import cast_params, unstack_layers

ScoreFn = Callable[[np.ndarray, np.ndarray], Any]


class PopulationStats(NamedTuple):
  """Per-member results of one population evaluation (host numpy arrays).

  ``rewards``, ``mean_length`` and ``mean_entropy`` cover all ``N`` members on every host;
  ``completions`` holds only the members whose devices belong to this process (all of them on one
  host), listed in ``local_members``.
  """

  rewards: np.ndarray  # [N, P] float32: score_fn per member and prompt.
  mean_length: np.ndarray  # [N] float32: mean generated tokens per prompt (EOS included).
  mean_entropy: np.ndarray  # [N] float32: mean token entropy over generated tokens.
  local_members: np.ndarray  # [n] int32: member index of each row of `completions`.
  completions: sampling.Completions  # numpy, [n, P, T] (lengths [n, P]).


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class PopulationSettings:
  """An ES population as it is evaluated: its noise, σ, the model and how members are batched.

  One value, validated on construction (a ValueError or TypeError names the field). A pytree
  like ``sampling.Decoding``: ``sigma`` is its leaf, traced under ``jit`` (a new σ does not
  recompile); the other fields are static (hashable) and decide the compiled program.

  Attributes:
    spec: the population's ``noise.NoiseSpec`` (``N`` divisible by the ``'pop'`` axis size
      times ``members_per_chunk``); each member is built as ``members.member`` builds it.
    sigma: noise scale σ, > 0.
    config: the model's ``ModelConfig``.
    members_per_chunk: members vmapped together on a device (``M``); each device loops over
      its ``N / (pop * M)`` chunks. Full rank holds ``M`` perturbed copies of θ per device.
    mesh: a ``sharding.make_mesh`` mesh whose ``'pop'`` axis splits the members, or None.
    share_sample_key: all members draw with one sample key (common random numbers) instead of
      member ``i`` with ``fold_in(sample_key, i)``.
  """

  spec: noise_lib.NoiseSpec
  sigma: float | jax.Array
  config: ModelConfig
  members_per_chunk: int = 1
  mesh: Mesh | None = None
  share_sample_key: bool = False

  def __post_init__(self):
    noise_lib.as_noise_spec(self.spec, "population.PopulationSettings")
    _checks.positive_int(self.members_per_chunk, "members_per_chunk")
    if self.spec.population_size % (self.pop_devices * self.members_per_chunk):
      raise ValueError(
        f"population_size={self.spec.population_size} must be divisible by the mesh's 'pop' "
        f"axis ({self.pop_devices} devices) x members_per_chunk={self.members_per_chunk} = "
        f"{self.pop_devices * self.members_per_chunk}: change one of them."
      )
    sigma = _checks.concrete_float(self.sigma)
    if sigma is not None and not sigma > 0:  # traced values are checked by whoever traced them
      raise ValueError(f"sigma={self.sigma!r} must be > 0.")
    object.__setattr__(self, "share_sample_key", bool(self.share_sample_key))

  @property
  def pop_devices(self) -> int:
    """Devices the members are split over (the mesh's ``'pop'`` axis)."""
    return 1 if self.mesh is None else self.mesh.shape["pop"]

  @property
  def sharded(self) -> bool:
    """Params split over ``'model'``: member noise drawn in each leaf's layout, on the shards."""
    return self.mesh is not None and self.mesh.shape["model"] > 1

  def tree_flatten(self):
    static = (self.spec, self.config, self.members_per_chunk, self.mesh, self.share_sample_key)
    return (self.sigma,), static

  @classmethod
  def tree_unflatten(cls, static, leaves):
    # No validation: the leaf may be a tracer, a sharding or an in_axes marker here.
    out = object.__new__(cls)
    names = ("spec", "config", "members_per_chunk", "mesh", "share_sample_key", "sigma")
    for name, value in zip(names, (*static, *leaves), strict=True):
      object.__setattr__(out, name, value)
    return out


def _member(params, step_key, i, settings: PopulationSettings, own, unroll_layers: bool):
  """Member ``i`` as the decode takes it: its weights in full rank and the in-place modes; in
  low rank the leaves it owns (``own[l]``, a list) with the hook's deltas and σ/√r."""
  spec = settings.spec
  member = members_lib.member(params, step_key, i, settings.sigma, spec, sharded=settings.sharded)
  if spec.rank is None:
    # Float32 masters of a bf16 model: the member is θ + σε rounded once to the compute dtype,
    # fused with the perturbation (no float32 member copy).
    params_i = cast_params(member.params, settings.config.jnp_dtype)
    if unroll_layers:
      # Hand generate its unrolled per-layer form directly: a member then holds one copy of θ,
      # not a stacked one plus generate's per-layer copy.
      params_i = unstack_layers(params_i)
    return member._replace(params=params_i)
  owned = [x for x, o in zip(jax.tree.leaves(member.params), own, strict=True) if o]
  return member._replace(params=owned)


def batch_members(params, owned: members_lib.Member, own: list[bool], axis: int | None):
  """A chunk of members (``axis`` 0: ``owned``'s leaves carry a leading member axis) or one
  member (``axis`` None) as ``sampling.generate_members`` (``generate``) takes it, from
  ``_member``'s output: ``(Member, its Member of in_axes)``. In low rank (``owned.params`` a list
  of the leaves ``own`` marks) the shared leaves come from ``params``, unbatched."""
  in_axes = lambda tree: jax.tree.map(lambda _: axis, tree)  # noqa: E731
  if not isinstance(owned.params, list):  # full rank: the whole tree is the member's
    return owned, members_lib.Member(in_axes(owned.params), None, None)
  base, treedef = jax.tree_util.tree_flatten(params)
  leaves = iter(owned.params)
  params_i = treedef.unflatten([next(leaves) if o else x for x, o in zip(base, own, strict=True)])
  axes = members_lib.Member(
    treedef.unflatten([axis if o else None for o in own]), in_axes(owned.deltas), axis
  )
  return owned._replace(params=params_i), axes


def _local_completions(
  params, prompt_ids, prompt_mask, step_key, sample_key, decoding, settings, *, first
):
  """The completions of one device's share of the members (``first`` onwards), chunk by
  chunk, for ``population_completions``."""
  n_local = settings.spec.population_size // settings.pop_devices
  ids = first + jnp.arange(n_local, dtype=jnp.int32)  # [n_local]
  own = members_lib.member_owned_leaves(params, settings.spec)
  inputs = functools.partial(  # i -> member i
    _member, params, step_key, settings=settings, own=own, unroll_layers=decoding.unroll_layers
  )

  def sample_keys(members):
    if settings.share_sample_key:
      return jnp.broadcast_to(sample_key, members.shape)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(sample_key, members)

  def chunk(members):  # [M]
    if settings.members_per_chunk == 1:
      # No member axis: a size-1 vmap turns every matmul into a batched dot, much slower on CPU.
      member, _ = batch_members(params, inputs(members[0]), own, None)
      key = sample_keys(members)[0]
      out = sampling.generate(
        member.params,
        prompt_ids,
        prompt_mask,
        decoding,
        key=key,
        config=settings.config,
        deltas=member.deltas,
        delta_scale=member.delta_scale,
      )
      return jax.tree.map(lambda x: x[None], out)
    # Noise one member at a time (lax.map, bit-identical to the update's regeneration for every
    # PRNG implementation; vmap is not for rbg).
    weights, axes = batch_members(params, jax.lax.map(inputs, members), own, 0)
    # One decode loop over the chunk's M x P rows; the model call is vmapped over members.
    keys = sample_keys(members)
    return sampling.generate_members(
      weights, axes, prompt_ids, prompt_mask, decoding, keys=keys, config=settings.config
    )

  # A scan over chunks: one chunk's perturbed weights live at a time.
  out = jax.lax.map(chunk, ids.reshape(-1, settings.members_per_chunk))  # leaves [C, M, P, ...]
  return jax.tree.map(lambda x: x.reshape(n_local, *x.shape[2:]), out)


@jax.jit
def population_completions(
  params: Any,
  prompt_ids: jax.Array,
  prompt_mask: jax.Array,
  step_key: jax.Array,
  sample_key: jax.Array,
  decoding: sampling.Decoding,
  settings: PopulationSettings,
) -> sampling.Completions:
  """Completions of every member, ``[N, P, T]``, split over ``'pop'`` (jitted, no host work).

  See ``evaluate_population`` for the arguments; inputs are not validated here (``settings``
  and ``decoding`` validated themselves on construction; their σ, temperature and top-p are
  traced, their other fields static). ``decoding.unroll_layers`` None decides from the mesh's
  devices (``sampling.default_unroll_layers``: on for CPUs), so compiling for a TPU mesh on a
  CPU host gets the TPU layout.
  """
  mesh = settings.mesh
  decoding = sampling.resolved(decoding, "population_completions", mesh)

  def local(*args):
    n_local = settings.spec.population_size // settings.pop_devices
    first = 0 if mesh is None else jax.lax.axis_index("pop") * n_local
    return _local_completions(*args, first=first)

  args = (params, prompt_ids, prompt_mask, step_key, sample_key, decoding, settings)
  if mesh is None:
    return local(*args)
  manual = {"pop"} if mesh.shape["model"] > 1 else set(mesh.axis_names)
  return jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(PartitionSpec(),) * len(args),
    out_specs=PartitionSpec("pop"),
    axis_names=frozenset(manual),
    check_vma=False,
  )(*args)


def evaluate_population(
  params: Any,
  prompt_ids: Any,
  prompt_mask: Any,
  *,
  settings: PopulationSettings,
  decoding: sampling.Decoding,
  step_key: jax.Array,
  score_fn: ScoreFn,
  sample_key: jax.Array | None = None,
) -> tuple[np.ndarray, PopulationStats]:
  """Fitness of the ES population ``θ + σ ε_i``, ``i < N``, on one batch of prompts.

  ``R_i = (1/P) Σ_p score_fn(tokens_i, mask_i)[p]``; rewards are maximised, and ``R`` feeds
  ``es_gradient(spec).update(..., fitness=R, key=step_key)`` with the same ``spec`` and
  ``step_key`` (or ``stats.rewards`` with ``shaping="per_prompt_zscore"``): one ``NoiseSpec``
  passed to both is what makes the update regenerate the noise the members were evaluated with.

  Args:
    params: base parameters θ (``es_jax.models.params(model)``).
    prompt_ids: ``[P, S]`` int, left-padded prompts (``sampling.pad_prompts``), the same for
      every member.
    prompt_mask: ``[P, S]`` bool, False on padding.
    settings: the population (``PopulationSettings``: spec, σ, model config, member batching,
      mesh, shared sample key).
    decoding: the ``sampling.Decoding`` every member decodes with: budget ``T``, temperature (0
      for greedy fitness, the paper's Easy setting), top-p, EOS and pad tokens.
    step_key: key of this ES step; member ``i``'s noise is ``noise.member_noise(params, step_key,
      i, spec)``.
    score_fn: host function ``(tokens [P, T] np.int32, mask [P, T] np.bool_) -> [P] rewards``,
      called once per member (decode with a tokenizer and score with a verifier there).
    sample_key: key for sampled decoding (required unless ``decoding`` is greedy); member
      ``i`` draws with ``fold_in(sample_key, i)``, or all members with ``sample_key`` if
      ``settings.share_sample_key`` (common random numbers).

  Returns:
    ``(fitness [N] float32, PopulationStats)``. NaN rewards give NaN fitness, which
    ``es_jax.es.fitness`` ranks worst.

  Raises:
    TypeError: ``settings`` is not a ``PopulationSettings`` or ``decoding`` not a ``Decoding``.
  """
  prompt_ids, prompt_mask = _checked_inputs(settings, decoding, sample_key, prompt_ids, prompt_mask)
  if settings.mesh is not None:
    params = sharding_lib.place_params(params, settings.mesh)
  settings = jax.tree.map(lambda s: jnp.asarray(s, jnp.float32), settings)
  out = population_completions(
    params,
    prompt_ids,
    prompt_mask,
    step_key,
    step_key if sample_key is None else sample_key,  # unused when greedy
    decoding.as_float32(),
    settings,
  )
  return _score(out, score_fn, prompt_ids.shape[0], settings.spec.population_size)


def _checked_inputs(settings, decoding, sample_key, ids, mask):
  """``evaluate_population``'s checks (ValueError / TypeError naming the argument); returns the
  prompts as numpy ``int32`` / ``bool`` arrays."""
  for name, value, kind in (
    ("settings", settings, PopulationSettings),
    ("decoding", decoding, sampling.Decoding),
  ):
    if not isinstance(value, kind):
      raise TypeError(
        f"population.evaluate_population: {name} must be a {kind.__module__.split('.')[-1]}."
        f"{kind.__name__}, got {type(value).__name__}."
      )
  if not decoding.greedy and sample_key is None:
    raise ValueError(f"temperature={decoding.temperature} samples tokens: pass sample_key=.")
  prompt_ids = np.asarray(ids, np.int32)
  prompt_mask = np.asarray(mask, bool)
  if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
    raise ValueError(
      f"prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must be equal "
      "[P, S] shapes."
    )
  return prompt_ids, prompt_mask


def _score(
  out: sampling.Completions, score_fn: ScoreFn, num_prompts: int, population_size: int
) -> tuple[np.ndarray, PopulationStats]:
  """Host side of ``evaluate_population``: scores this process's members, gathers the ``[N, P]``
  rewards and ``[N]`` statistics of every host, and averages the rewards into fitness."""
  members = sharding_lib.local_rows(out.tokens)[0]
  local = sampling.Completions(*(sharding_lib.local_rows(x)[1] for x in out))
  rewards = np.zeros((len(members), num_prompts), np.float32)
  for row, m in enumerate(members):
    r = np.asarray(score_fn(local.tokens[row], local.mask[row]), np.float32)
    if r.shape != (num_prompts,):
      raise ValueError(
        f"score_fn returned shape {r.shape} for member {m}, expected ({num_prompts},): one "
        "reward per prompt."
      )
    rewards[row] = r
  n_tokens = local.mask.sum(axis=(1, 2))
  per_member = {
    "members": members,
    "rewards": rewards,
    "mean_length": local.lengths.mean(axis=1).astype(np.float32),
    "mean_entropy": (
      (local.entropy * local.mask).sum(axis=(1, 2)) / np.maximum(n_tokens, 1)
    ).astype(np.float32),
  }
  if jax.process_count() > 1:
    # Every host contributes its members' rows; only [N, P] + [N] floats cross hosts.
    gathered = multihost_utils.process_allgather(per_member)
    per_member = {k: np.concatenate(list(v), axis=0) for k, v in gathered.items()}
  full = {}
  for name in ("rewards", "mean_length", "mean_entropy"):
    values = per_member[name]
    arr = np.full((population_size, *values.shape[1:]), np.nan, np.float32)
    arr[per_member["members"]] = values
    full[name] = arr
  fitness = full["rewards"].mean(axis=1).astype(np.float32)
  stats = PopulationStats(
    rewards=full["rewards"],
    mean_length=full["mean_length"],
    mean_entropy=full["mean_entropy"],
    local_members=members,
    completions=local,
  )
  return fitness, stats
