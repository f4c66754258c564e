"""Evaluating an ES population: perturbed members generate, the host scores, fitness comes back.

One ES evaluation (docs/method.md §1; docs/architecture.md, "Data flow")::

  for member i in [0, N):                    # chunks of M members, vmapped within a device,
    θ_i = θ + σ ε_i                          # chunks split over the mesh axis 'pop'
    completions_i = generate(θ_i, prompts)   # [P, T], the same prompts for every member
  host: rewards[i, p] = score_fn(tokens_i, mask_i)[p]       # [N, P]
  fitness R_i = mean_p rewards[i, p]                         # [N], rewards are maximised

Member ``i`` is ``es_jax.members.member(params, step_key, i, sigma, spec)``: its noise is
``noise.member_noise(params, step_key, i, spec)``, which the update (``es_jax.es.es_gradient``)
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

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec

from es_jax import _checks, sampling
from es_jax import members as members_lib
from es_jax import noise as noise_lib
from es_jax import sharding as sharding_lib
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


def _member_inputs(params, step_key, i, sigma, spec, own, *, config, sharded, unroll_layers):
  """Member ``i`` as the decode takes it: ``(its weights, None)`` in full rank and the in-place
  modes; in low rank ``(the leaves it owns (own[l]), the hook's deltas)``."""
  params_i, deltas, _ = members_lib.member(params, step_key, i, sigma, spec, sharded=sharded)
  if spec.rank is None:
    # Float32 masters of a bf16 model: the member is θ + σε rounded once to the compute dtype,
    # fused with the perturbation (no float32 member copy).
    params_i = cast_params(params_i, config.jnp_dtype)
    if unroll_layers:
      # Hand generate its unrolled per-layer form directly: a member then holds one copy of θ,
      # not a stacked one plus generate's per-layer copy.
      params_i = unstack_layers(params_i)
    return params_i, None
  return [x for x, o in zip(jax.tree.leaves(params_i), own, strict=True) if o], deltas


def _member_params(params, owned, own, axis, rank):
  """The member's params (axis None) or the chunk's (axis 0) from its ``_member_inputs``, with
  the in_axes tree: in low rank the shared leaves come from ``params``, unbatched."""
  if rank is None:
    return owned, jax.tree.map(lambda _: axis, owned)
  base, treedef = jax.tree_util.tree_flatten(params)
  owned = iter(owned)
  params_i = treedef.unflatten([next(owned) if o else x for x, o in zip(base, own, strict=True)])
  return params_i, treedef.unflatten([axis if o else None for o in own])


def _local_completions(
  params, prompt_ids, prompt_mask, step_key, sample_key, sigma, decoding, *, first, n_local, kw
):
  """The completions of members ``first .. first + n_local`` (one device's share), chunk by
  chunk; ``kw`` holds ``population_completions``' static settings."""
  spec, chunk_size, config = kw["spec"], kw["members_per_chunk"], kw["config"]
  ids = first + jnp.arange(n_local, dtype=jnp.int32)  # [n_local]
  own = members_lib.member_owned_leaves(params, spec)
  inputs = functools.partial(  # i -> member i's inputs
    _member_inputs,
    params,
    step_key,
    sigma=sigma,
    spec=spec,
    own=own,
    config=config,
    sharded=kw["sharded"],
    unroll_layers=kw["unroll_layers"],
  )
  decode_kw = dict(
    **decoding.generate_kwargs(),
    config=config,
    delta_scale=None if spec.rank is None else sigma / jnp.float32(math.sqrt(spec.rank)),
    unroll_layers=kw["unroll_layers"],
  )

  def sample_keys(members):
    if kw["share_sample_key"]:
      return jnp.broadcast_to(sample_key, members.shape)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(sample_key, members)

  def chunk(members):  # [M]
    if chunk_size == 1:
      # No member axis: a size-1 vmap turns every matmul into a batched dot, much slower on CPU.
      owned, deltas = inputs(members[0])
      member_params = _member_params(params, owned, own, None, spec.rank)[0]
      key = sample_keys(members)[0]
      out = sampling.generate(
        member_params, prompt_ids, prompt_mask, key=key, deltas=deltas, **decode_kw
      )
      return jax.tree.map(lambda x: x[None], out)
    # Noise one member at a time (lax.map, bit-identical to the update's regeneration for every
    # PRNG implementation; vmap is not for rbg).
    owned, deltas = jax.lax.map(inputs, members)
    params_m, params_axes = _member_params(params, owned, own, 0, spec.rank)
    # One decode loop over the chunk's M x P rows; the model call is vmapped over members.
    return sampling.generate_members(
      params_m,
      prompt_ids,
      prompt_mask,
      keys=sample_keys(members),
      params_axes=params_axes,
      deltas=deltas,
      deltas_axes=None if deltas is None else jax.tree.map(lambda _: 0, deltas),
      **decode_kw,
    )

  # A scan over chunks: one chunk's perturbed weights live at a time.
  out = jax.lax.map(chunk, ids.reshape(-1, chunk_size))  # leaves [C, M, P, ...]
  return jax.tree.map(lambda x: x.reshape(n_local, *x.shape[2:]), out)


@functools.partial(
  jax.jit,
  # Static: they decide shapes, the noise structure, the sharding and the compiled program.
  static_argnames=tuple(
    "config spec members_per_chunk mesh share_sample_key unroll_layers".split()
  ),
)
def population_completions(
  params: Any,
  prompt_ids: jax.Array,
  prompt_mask: jax.Array,
  step_key: jax.Array,
  sample_key: jax.Array,
  sigma: jax.Array,
  decoding: sampling.Decoding,
  *,
  config: ModelConfig,
  spec: noise_lib.NoiseSpec,
  members_per_chunk: int,
  mesh: Mesh | None,
  share_sample_key: bool,
  unroll_layers: bool | None = None,
) -> sampling.Completions:
  """Completions of every member, ``[N, P, T]``, split over ``'pop'`` (jitted, no host work).

  See ``evaluate_population`` for the arguments; inputs are not validated here (``spec`` and
  ``decoding`` validated themselves on construction; ``spec`` is static and hashable,
  ``decoding`` a pytree whose temperature and top-p are traced). ``unroll_layers``: decode over
  per-layer weights (see ``sampling.generate``); None decides from the mesh's devices
  (``sampling.default_unroll_layers``: on for CPUs), so compiling for a TPU mesh on a CPU host
  gets the TPU layout.
  """
  spec = noise_lib.as_noise_spec(spec, "population_completions")
  n_dev = 1 if mesh is None else mesh.shape["pop"]
  n_local = spec.population_size // n_dev
  kw = dict(
    spec=spec,
    config=config,
    members_per_chunk=members_per_chunk,
    share_sample_key=share_sample_key,
    # Params split over 'model': member noise drawn in each leaf's layout, on the shards only.
    sharded=mesh is not None and mesh.shape["model"] > 1,
    unroll_layers=sampling.default_unroll_layers(mesh) if unroll_layers is None else unroll_layers,
  )

  def local(*args):
    first = 0 if mesh is None else jax.lax.axis_index("pop") * n_local
    return _local_completions(*args, first=first, n_local=n_local, kw=kw)

  args = (params, prompt_ids, prompt_mask, step_key, sample_key, sigma, decoding)
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
  config: ModelConfig,
  step_key: jax.Array,
  sigma: float | jax.Array,
  spec: noise_lib.NoiseSpec,
  decoding: sampling.Decoding,
  score_fn: ScoreFn,
  mesh: Mesh | None = None,
  members_per_chunk: int = 1,
  sample_key: jax.Array | None = None,
  share_sample_key: bool = False,
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
    config: the model's config.
    step_key: key of this ES step; member ``i``'s noise is ``noise.member_noise(params, step_key,
      i, spec)``.
    sigma: noise scale σ (traced: changing it does not recompile); validated > 0 here.
    spec: the population's ``noise.NoiseSpec`` (``N`` divisible by the ``'pop'`` axis size
      times ``members_per_chunk``); each member is built as ``members.member`` builds it.
    decoding: the ``sampling.Decoding`` every member decodes with: budget ``T``, temperature (0
      for greedy fitness, the paper's Easy setting), top-p, EOS and pad tokens.
    score_fn: host function ``(tokens [P, T] np.int32, mask [P, T] np.bool_) -> [P] rewards``,
      called once per member (decode with a tokenizer and score with a verifier there).
    mesh: a ``sharding.make_mesh`` mesh whose ``'pop'`` axis splits the members, or None.
    members_per_chunk: members vmapped together on a device (``M``); each device loops over its
      ``N / (pop * M)`` chunks. Full rank holds ``M`` perturbed copies of θ per device.
    sample_key: key for sampled decoding (required unless ``decoding`` is greedy); member
      ``i`` draws with ``fold_in(sample_key, i)``, or all members with ``sample_key`` if
      ``share_sample_key`` (common random numbers).
    share_sample_key: see ``sample_key``.

  Returns:
    ``(fitness [N] float32, PopulationStats)``. NaN rewards give NaN fitness, which
    ``es_jax.fitness`` ranks worst.

  Raises:
    TypeError: ``spec`` is not a ``NoiseSpec`` or ``decoding`` not a ``Decoding``.
  """
  spec = noise_lib.as_noise_spec(spec, "population.evaluate_population")
  population_size = spec.population_size
  prompt_ids, prompt_mask = _checked_inputs(
    spec, members_per_chunk, mesh, sigma, decoding, sample_key, prompt_ids, prompt_mask
  )
  num_prompts = prompt_ids.shape[0]
  if mesh is not None:
    params = sharding_lib.place_params(params, mesh)
  decoding = decoding.as_float32()
  out = population_completions(
    params,
    prompt_ids,
    prompt_mask,
    step_key,
    step_key if sample_key is None else sample_key,  # unused when greedy
    jnp.asarray(sigma, jnp.float32),
    decoding,
    config=config,
    spec=spec,
    members_per_chunk=members_per_chunk,
    mesh=mesh,
    share_sample_key=share_sample_key,
  )
  return _score(out, score_fn, num_prompts, population_size)


def _checked_inputs(spec, members_per_chunk, mesh, sigma, decoding, sample_key, ids, mask):
  """``evaluate_population``'s checks (ValueError / TypeError naming the argument); returns the
  prompts as numpy ``int32`` / ``bool`` arrays."""
  _checks.positive_int(members_per_chunk, "members_per_chunk")
  n_dev = 1 if mesh is None else mesh.shape["pop"]
  if spec.population_size % (n_dev * members_per_chunk):
    raise ValueError(
      f"population_size={spec.population_size} must be divisible by the mesh's 'pop' axis "
      f"({n_dev} devices) x members_per_chunk={members_per_chunk} = "
      f"{n_dev * members_per_chunk}: change one of them."
    )
  sigma_value = _checks.concrete_float(sigma)
  if sigma_value is not None and not sigma_value > 0:
    raise ValueError(f"sigma={sigma!r} must be > 0.")
  if not isinstance(decoding, sampling.Decoding):
    raise TypeError(
      f"population.evaluate_population: decoding must be a sampling.Decoding, got "
      f"{type(decoding).__name__}."
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
