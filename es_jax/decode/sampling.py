"""Batched autoregressive sampling with a KV cache (greedy, temperature, top-p).

One compile per (batch, prompt length, max_new_tokens, eos set, top-p on/off, greedy): temperature
and top-p values are traced, so sweeping them does not recompile; `pad_prompts` buckets prompt
lengths (`bucket_length`) so new batches reuse compiled code, and `Decoding.prefill_rows`
prefills each of a batch's distinct prompts once (an evaluation's n samples or a GRPO rollout's
G completions of one prompt share its prefill). `generate` works under `jax.vmap` over a leading
params (or low-rank delta) axis and with the prompt batch sharded over devices (jit follows the
input sharding). `generate_members` is the faster form of that vmap for many models on the same
prompts (an ES population's members): one decode loop over all members' rows, with only the model
call vmapped over members. More prompts than rows (an evaluation's problems x samples, a GRPO
rollout's prompts x G) go through `es_jax.decode.queue.generate_queue`, which refills rows as
their completions end.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from es_jax import _checks
from es_jax.decode.loop import Completions, decode
from es_jax.es import member_axes as axes_lib
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import Params, Transformer
from es_jax.models.transformer import params as model_params

# The decode loop's layout defaults (`Decoding`'s kv_chunk and compactions; es_jax.decode.loop).
# Off for a direct call (runs set them with config.decode, whose kv_chunk default is 128): the
# bucketed read sums the softmax without the masked slots and a shrinking batch rounds some rows
# differently on XLA:CPU, so sampled tokens near a boundary can change, and each compaction
# phase compiles another copy of the step. Set kv_chunk=128 (and compactions=2) to read only
# the prompt and the first 128 generated tokens' slots while they suffice (and drop finished
# rows).
KV_CHUNK = None
COMPACTIONS = 0


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Decoding:
  """How completions are decoded: the budget, the sampling, the stop tokens and the loop's layout.

  One value, passed whole from the config to the decode loop, validated once on construction (a
  ValueError names the field). A pytree: ``temperature`` and ``top_p`` are its leaves, traced
  under ``jit`` (a new value does not recompile); the other fields are static.
  Greedy decoding (``temperature`` 0) and no nucleus (``top_p`` None or >= 1) are stored as
  None, so they belong to the static structure and compile the cheaper program (argmax only).

  Attributes:
    max_new_tokens: decode budget ``T`` (static).
    temperature: 0 (stored as None) for greedy, else > 0.
    top_p: nucleus mass in (0, 1), or None.
    eos_ids: tokens that end a completion (the EOS token is kept and counted in the length).
    pad_id: filler after a completion ends.
    kv_chunk: read only the prompt's and the next kv_chunk slots of the KV cache while they
      hold the filled slots (None: the whole cache every step); static. See `generate`.
    compactions: halvings of the batch as rows end (finished rows stop costing); static.
    unroll_layers: decode over per-layer copies of the weights (see `generate`); None: decided
      where the decode runs (`default_unroll_layers`, on for CPUs); static.
    refill_rows: `decode_queue.generate_queue`'s R, items prefilled together once R rows are
      free (None: a quarter of the rows); static.
    prefill_rows: at most this many distinct prompts among `generate`'s rows: a run of
      adjacent rows with equal prompts (an evaluation's n samples of a problem, a GRPO
      rollout's G completions) is prefilled once and its KV cache and last logits copied to
      its rows (None: every row is prefilled); static. See `generate`.
  """

  max_new_tokens: int
  temperature: float | jax.Array | None = 0.0
  top_p: float | jax.Array | None = None
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  kv_chunk: int | None = KV_CHUNK
  compactions: int = COMPACTIONS
  unroll_layers: bool | None = None
  refill_rows: int | None = None
  prefill_rows: int | None = None

  def __post_init__(self):
    def put(name, value):
      object.__setattr__(self, name, value)

    try:
      put("max_new_tokens", operator.index(self.max_new_tokens))
    except TypeError:
      raise ValueError(
        f"Decoding.max_new_tokens={self.max_new_tokens!r} must be an int (it is static)."
      ) from None
    _checks.positive_int(self.max_new_tokens, "Decoding.max_new_tokens")
    put("eos_ids", tuple(int(e) for e in self.eos_ids))
    put("pad_id", int(self.pad_id))
    layout = [int(x) if isinstance(x, np.integer) else x for x in (self.kv_chunk, self.compactions)]
    for name, value in _loop_options(*layout, "Decoding.").items():
      put(name, value)
    if self.unroll_layers is not None:
      put("unroll_layers", bool(self.unroll_layers))
    for name in ("refill_rows", "prefill_rows"):
      rows = getattr(self, name)
      if rows is not None:
        rows = int(rows) if isinstance(rows, np.integer) else rows
        put(name, _checks.positive_int(rows, f"Decoding.{name}"))
    t = None if self.temperature is None else _checks.concrete_float(self.temperature)
    if t is not None:  # traced values are checked by whoever traced them
      if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"Decoding.temperature={t} must be a finite number >= 0.")
      if t == 0:
        put("temperature", None)
    p = None if self.top_p is None else _checks.concrete_float(self.top_p)
    if p is not None:
      if not 0 < p <= 1:
        raise ValueError(f"Decoding.top_p={p} must be in (0, 1] (or None).")
      if p >= 1:
        put("top_p", None)
    if self.temperature is None:
      put("top_p", None)  # greedy ignores the nucleus

  @property
  def greedy(self) -> bool:
    return self.temperature is None

  @property
  def use_top_p(self) -> bool:
    return self.top_p is not None

  def replace(self, **changes) -> Decoding:
    """These settings with `changes` (validated as on construction)."""
    return dataclasses.replace(self, **changes)

  def as_float32(self) -> Decoding:
    """The same settings with float32 array leaves: one argument type for a jitted callee, so
    Python and numpy values do not compile programs of their own."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), self)

  def tree_flatten(self):
    static = (self.max_new_tokens, self.eos_ids, self.pad_id, self.kv_chunk, self.compactions)
    static += (self.unroll_layers, self.refill_rows, self.prefill_rows)
    return (self.temperature, self.top_p), static

  @classmethod
  def tree_unflatten(cls, static, leaves):
    # No validation: leaves may be tracers, shardings or in_axes markers here.
    out = object.__new__(cls)
    names = ("max_new_tokens", "eos_ids", "pad_id", "kv_chunk", "compactions")
    names += ("unroll_layers", "refill_rows", "prefill_rows", "temperature", "top_p")
    for name, value in zip(names, (*static, *leaves), strict=True):
      object.__setattr__(out, name, value)
    return out


def bucket_length(length: int, bucket: int | None = None) -> int:
  """`length` rounded up to a prompt-length bucket: a multiple of `bucket`, or with None one of
  16, 32, 48, 64, 80, 96, 112, 128, 160, 192, ... (multiples of a quarter of the power of two
  below `length`, at least 16): at most 25% padding past 64 tokens, and four compiled shapes per
  doubling of the length however widely prompts vary."""
  length = max(int(length), 1)
  if bucket is None:
    bucket = max(16, (1 << (length - 1).bit_length()) // 8)
  return -(-length // bucket) * bucket


def pad_prompts(
  prompts: Sequence[Sequence[int]],
  *,
  pad_id: int,
  bucket: int | None = None,
  min_length: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads token lists to a common length rounded up by `bucket_length` (a multiple of
  `bucket`, or the default bucket ladder with None).

  Returns (ids [B, S] int32, mask [B, S] bool). Rounding keeps the number of distinct prompt
  shapes (hence compiles) small.
  """
  if not prompts:
    raise ValueError("pad_prompts: got no prompts.")
  length = bucket_length(max(max(len(p) for p in prompts), min_length, 1), bucket)
  ids = np.full((len(prompts), length), pad_id, np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for i, p in enumerate(prompts):
    if len(p):
      ids[i, length - len(p) :] = p
      mask[i, length - len(p) :] = True
  return ids, mask


def pad_id(tokenizer) -> int:
  """The token prompts are padded with: the tokenizer's pad token, else 0 (it is masked out)."""
  return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)


def encode_prompts(tokenizer, texts: Sequence[str], *, bucket: int | None = None):
  """Tokenises already-formatted prompt strings and left-pads them (see `pad_prompts`)."""
  ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
  return pad_prompts(ids, pad_id=pad_id(tokenizer), bucket=bucket)


def _platform_of(mesh_or_devices) -> str | None:
  if mesh_or_devices is None:
    return None
  devices = getattr(mesh_or_devices, "devices", mesh_or_devices)  # a Mesh's device array
  devices = np.asarray(devices, dtype=object).reshape(-1)
  return devices[0].platform if devices.size else None


def default_unroll_layers(mesh_or_devices=None) -> bool:
  """`generate`'s default for `unroll_layers`: on when the target devices are CPUs.

  The target is the platform of `mesh_or_devices` (a `Mesh` or a sequence of devices) when
  given, else the default backend. The decision follows
  the devices the program runs on, not the host: a CPU host compiling for a TPU mesh gets the
  TPU layout (scanned layers).
  """
  platform = _platform_of(mesh_or_devices) or jax.default_backend()
  return platform == "cpu"


def generate(
  params_or_model: Params | Transformer,
  prompt_ids,
  prompt_mask,
  decoding: Decoding,
  *,
  key: jax.Array,
  config: ModelConfig | None = None,
  deltas: Params | None = None,
  delta_scale: float | jax.Array | None = None,
) -> Completions:
  """Samples continuations of left-padded prompts.

  Args:
    params_or_model: a `Transformer`, or its parameter dict (then `config` is required).
    prompt_ids: [B, S] int, left-padded (see `pad_prompts`).
    prompt_mask: [B, S] bool, False on padding.
    decoding: the decode settings (`Decoding`). Its temperature is traced, so changing it does
      not recompile; greedy (temperature 0) compiles a greedy-only program that skips the
      sampling work (argmax only); no nucleus (top_p None) is a static switch, the value
      traced. The EOS token is kept (masked in) and counted in lengths. Its layout:
      `unroll_layers` decodes with per-layer copies of the weights in an unrolled layer loop
      (`es_jax.models.transformer.unstack_layers`) instead of scanning the stacked layers: one
      copy of the layer weights per call and a longer compile, but XLA:CPU does not copy every
      layer's weights on every step (None: `default_unroll_layers()`, on when the target is a
      CPU; parameters whose "layers" are already unstacked always run unrolled, without that
      copy). `kv_chunk`: while the generated tokens fit in the kv_chunk cache slots after the
      prompt's, a decode step reads only the prompt's slots and those (a short completion does
      not pay for the whole budget); past them, and with None, it reads the whole allocated
      cache. `compactions`: how many times the batch may halve as rows end (finished rows
      leave the batch; each halving compiles one more copy of the step); 0 decodes the whole
      batch until its longest row ends. Neither changes a row's draws; both change the float
      rounding of its logits, so a sampled token at a rounding boundary can differ from the
      static loop's (`es_jax.decode.loop`). A batch sharded over devices is compacted within
      each device's rows. `prefill_rows` U: the prompts are read as runs of adjacent equal
      rows (equal ids and mask), at most U of them; each run's prompt is prefilled once, in a
      batch of U rows, and its KV cache and last logits copied to the run's rows (U >= the
      batch: every row prefilled). A row's draws are unchanged; its logits are rounded as in a
      batch of U rows. More runs than U raise a ValueError (checked where the prompts are
      concrete; traced prompts with more runs than U decode wrong rows).
    key: PRNG key; row draws at step t use fold_in(key, t). Or one typed key per row ([B]):
      row r then draws as a one-row batch with key[r] does (`decode_loop.row_uniform`), so its
      tokens follow from its key whatever the batch (as a work item's in `generate_queue`).
    config: model config when passing a params dict.
    deltas, delta_scale: low-rank perturbations for the model (see es_jax.models.forward).

  Returns:
    Completions with tokens, logprobs, entropy, mask [B, max_new_tokens] and lengths [B].
  """
  if isinstance(params_or_model, Transformer):
    config = params_or_model.config
    params_or_model = model_params(params_or_model)
  if config is None:
    raise ValueError("generate: pass `config=` when giving a params dict instead of a model.")
  prompt_ids, prompt_mask = _checked_prompts("generate", prompt_ids, prompt_mask)
  _check_keys("generate", "key", key, (), (prompt_ids.shape[0],))
  _check_prompt_runs("generate", prompt_ids, prompt_mask, decoding)
  return decode(
    axes_lib.Member(params_or_model, deltas, delta_scale),
    prompt_ids,
    prompt_mask,
    key,
    resolved(decoding, "generate"),
    config=config,
    row_groups=_row_shards(prompt_ids),
  )


def resolved(decoding: Decoding, caller: str, mesh_or_devices=None) -> Decoding:
  """`decoding` as the decode loop takes it: `unroll_layers` decided (`default_unroll_layers`
  of `mesh_or_devices`) and float32 temperature and top-p (one argument type for the jitted
  loop, so Python and numpy values do not compile programs of their own). TypeError naming
  `caller` unless `decoding` is a `Decoding`."""
  if not isinstance(decoding, Decoding):
    raise TypeError(
      f"{caller}: decoding must be a sampling.Decoding, got {type(decoding).__name__}."
    )
  if decoding.unroll_layers is None:
    decoding = decoding.replace(unroll_layers=default_unroll_layers(mesh_or_devices))
  return decoding.as_float32()


def _check_keys(caller: str, name: str, key, *shapes) -> None:
  """ValueError naming `caller` unless `key` is a typed PRNG key array of one of `shapes`."""
  typed = jnp.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key)
  if not typed and shapes[0] == () and getattr(key, "shape", None) == (2,):
    return  # a raw uint32 key: one key for the batch
  if not typed or key.shape not in shapes:
    raise ValueError(
      f"{caller}: {name} must be a typed PRNG key (jax.random.key) of shape "
      f"{' or '.join(map(str, shapes))}, got {getattr(key, 'dtype', type(key))} "
      f"{getattr(key, 'shape', '')}."
    )


def prompt_runs(prompt_ids, prompt_mask) -> int:
  """The number of runs of adjacent equal rows (equal ids and mask) in [B, S] prompts."""
  ids, mask = np.asarray(prompt_ids), np.asarray(prompt_mask)
  same = np.all(ids[1:] == ids[:-1], axis=1) & np.all(mask[1:] == mask[:-1], axis=1)
  return int(len(ids) - np.sum(same))


def _check_prompt_runs(caller: str, prompt_ids, prompt_mask, decoding) -> None:
  """ValueError naming `caller` when concrete prompts hold more runs of equal rows than
  `decoding.prefill_rows` (`generate`'s shared prefill)."""
  rows = getattr(decoding, "prefill_rows", None)
  if rows is None or rows >= prompt_ids.shape[0]:
    return
  if isinstance(prompt_ids, jax.core.Tracer) or isinstance(prompt_mask, jax.core.Tracer):
    return
  # Across processes no host holds every row (the GRPO rollout's rows repeat each prompt G times:
  # it has at most P runs by construction); only rows this process can read are counted.
  if not all(getattr(x, "is_fully_addressable", True) for x in (prompt_ids, prompt_mask)):
    return
  runs = prompt_runs(prompt_ids, prompt_mask)
  if runs > rows:
    raise ValueError(
      f"{caller}: the {prompt_ids.shape[0]} prompt rows hold {runs} runs of equal adjacent "
      f"rows, more than Decoding.prefill_rows={rows}: raise prefill_rows, or put the rows of "
      "each prompt next to each other."
    )


def _row_shards(prompt_ids) -> int:
  """How many shards the batch axis of `prompt_ids` is split into (1 when it is not, or is
  traced): finished rows are then compacted within each shard, never moved between devices."""
  try:
    rows_per_shard = prompt_ids.sharding.shard_shape(prompt_ids.shape)[0]
  except (AttributeError, TypeError, ValueError):
    return 1
  return max(prompt_ids.shape[0] // max(rows_per_shard, 1), 1)


def _loop_options(kv_chunk, compactions, prefix: str = "") -> dict:
  """The decode loop's layout settings, checked (ValueError naming the argument)."""
  if kv_chunk is not None:
    _checks.positive_int(kv_chunk, f"{prefix}kv_chunk")
  if isinstance(compactions, bool) or not isinstance(compactions, int) or compactions < 0:
    raise ValueError(
      f"{prefix}compactions={compactions!r} must be a Python int >= 0 (it is static)."
    )
  return dict(kv_chunk=None if kv_chunk is None else int(kv_chunk), compactions=int(compactions))


def _checked_prompts(caller: str, prompt_ids, prompt_mask):
  """(ids int32, mask bool) as arrays; ValueError naming `caller` on bad shapes."""
  prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
  prompt_mask = jnp.asarray(prompt_mask, bool)
  if prompt_ids.shape != prompt_mask.shape or prompt_ids.ndim != 2:
    raise ValueError(
      f"{caller}: prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must be "
      "equal [batch, length] shapes."
    )
  return prompt_ids, prompt_mask


def generate_members(
  members: axes_lib.Member,
  axes: axes_lib.Member,
  prompt_ids,
  prompt_mask,
  decoding: Decoding,
  *,
  keys: jax.Array,
  config: ModelConfig,
) -> Completions:
  """Samples the same prompts from M models at once (an ES population's members).

  Member i's model is `members` (params, low-rank deltas and delta_scale, as `generate` takes
  them) with every leaf that `axes` marks 0 indexed at [i] on its leading member axis; leaves
  marked None are shared by all members, as with `jax.vmap`'s in_axes (here given leaf by leaf,
  as a full `Member` tree of 0 / None). Member i decodes with `keys[i]` exactly as
  `generate(member_i, prompt_ids, prompt_mask, decoding, key=keys[i], ...)` does (the same
  tokens; logprobs equal up to float rounding), but all M x P rows run as one batch in one
  decode loop: only the model call is vmapped over members. (`jax.vmap(generate)` would batch
  the loop's stopping test, which then selects the whole KV cache on every step.) Shared
  matrices are one matmul for all rows; low-rank `deltas` add each member's own term (see
  `es_jax.models.forward`).

  Args:
    members: `Member(params, deltas, delta_scale)` with the member axes described above (params
      may have unstacked layers; deltas and delta_scale None in full rank).
    axes: `Member(params_axes, deltas_axes, delta_scale_axis)`: 0 (per member) or None
      (shared) for every leaf of the matching part of `members`.
    prompt_ids, prompt_mask: [P, S], the same prompts for every member.
    decoding, config: as for `generate`.
    keys: [M] PRNG keys, one per member (M is the number of members).

  Returns:
    Completions with leaves [M, P, ...].
  """
  prompt_ids, prompt_mask = _checked_prompts("generate_members", prompt_ids, prompt_mask)
  members, axes = axes_lib.Member(*members), axes_lib.Member(*axes)
  if (members.deltas is None) != (axes.deltas is None):
    raise ValueError("generate_members: pass deltas and deltas_axes together.")
  if keys.ndim != 1:
    raise ValueError(f"generate_members: keys must be [M] (one per member), got {keys.shape}.")
  for name in axes_lib.Member._fields:
    axes_lib.check_member_axes(name, getattr(members, name), getattr(axes, name), keys.shape[0])
  shape = (keys.shape[0], *prompt_ids.shape)
  return decode(
    members,
    jnp.broadcast_to(prompt_ids, shape),
    jnp.broadcast_to(prompt_mask, shape),
    keys,
    resolved(decoding, "generate_members"),
    config=config,
    member_axes=axes_lib.split_axes(axes),
  )
