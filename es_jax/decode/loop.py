"""The jitted decode loop behind `sampling.generate` and `sampling.generate_members`.

A prefill over the left-padded prompts, then one model call per generated token, in a
`lax.while_loop` that stops once every row has ended. Two things keep a step's cost following
the tokens actually being generated:

* While the generated tokens fit in the first `kv_chunk` slots after the prompt's, a step reads
  only the prompt's slots and those (`es_jax.models.attention.bucketed_cached_attention`), not
  the whole allocated prompt + budget length.
* Rows that have ended leave the batch: the loop runs in phases of shrinking static batch sizes
  (P, ⌈P/2⌉, ⌈P/4⌉, ... rows per member, `compactions` halvings); a phase ends once every
  member's unfinished rows fit the next size, and the unfinished rows (with their cache) are
  gathered into it. Each phase is one more compiled copy of the step.

Every row keeps its identity through the compactions: its outputs land in its original row and
its draws are its original row's, ``u = uniform(fold_in(key, t), (P,))[row]`` at step t (per
member key in member mode), exactly the static loop's. With JAX's partitionable threefry (the
default), element ``row`` of that draw does not depend on P, so a row's tokens are a function of
(key, row index, prompt, model) whatever else is in the batch, up to the float rounding of its
logits: XLA:CPU's matmuls may round a row differently in a batch of another size, and a prefix
read sums the softmax without the masked slots' zeros, maybe in another order. That moves a
sampled token only where the row's uniform falls within rounding of a token boundary (or a
greedy near-tie), after which the row continues differently: on SmolLM2-135M, 1 row of 16
after 223 sampled tokens with compaction alone (docs/benchmarks.md); on the tiny test models,
none.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from es_jax.decode import token_sampling
from es_jax.es import member_axes as axes_lib
from es_jax.es.member_axes import Member
from es_jax.models.attention import init_cache, take_group_rows, take_rows, unstack_cache
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import ForwardMode, cast_params, forward, unstack_layers


class Completions(NamedTuple):
  """Generated continuations. Positions after a row's EOS are masked and hold `pad_id`."""

  tokens: jax.Array  # [B, T] int32
  logprobs: jax.Array  # [B, T] float32: log π(token) under the untempered model distribution.
  entropy: jax.Array  # [B, T] float32: full-distribution entropy of the untempered model.
  mask: jax.Array  # [B, T] bool: generated token (the EOS token included).
  lengths: jax.Array  # [B] int32: number of generated tokens, EOS included.


class _Rows(NamedTuple):
  """The loop state. Live-batch arrays have B' = M * P' rows (P' rows per member, a phase's
  size); `row` maps them to their original row within the member."""

  t: jax.Array  # () int32: the step whose token is emitted next.
  cache: object  # KVCache of the B' rows (vmapped over members in member mode).
  tok: jax.Array  # [B'] int32: the last emitted tokens.
  live: jax.Array  # [B'] bool: the last token was generated (not padding).
  done: jax.Array  # [B'] bool: the row has ended (EOS emitted, or never live).
  row: jax.Array  # [M, P'] int32: original row within the member.
  prompt_len: jax.Array  # [B'] int32
  out: Completions  # [M * P, T]: in the original row order.


def phase_sizes(rows: int, compactions: int) -> tuple[int, ...]:
  """Rows per member in each phase: `rows`, then halved (rounded up) `compactions` times."""
  sizes = [rows]
  for _ in range(compactions):
    if sizes[-1] > 1:
      sizes.append(-(-sizes[-1] // 2))
  return tuple(sizes)


def cache_length(prompt_len: int, max_new_tokens: int, kv_chunk: int | None) -> tuple[int, int]:
  """(cache slots, short prefix read while it holds the filled slots: the prompt's and
  `kv_chunk` more), the prefix None for dense reads and where it would be the whole cache."""
  need = prompt_len + max_new_tokens
  if kv_chunk is None or prompt_len + kv_chunk >= need:
    return need, None
  return need, prompt_len + kv_chunk


@functools.partial(
  jax.jit,
  # Static: the model structure, the member axes and the row groups decide the compiled program
  # (as do `decoding`'s static fields: budget, stop tokens, greedy, top-p on/off, layout).
  static_argnames=("config", "member_axes", "row_groups"),
)
def decode(
  weights: Member,
  prompt_ids,
  prompt_mask,
  key,
  decoding,
  *,
  config: ModelConfig,
  member_axes=None,
  row_groups: int = 1,
):
  """The decode loop of `generate` and, with `member_axes`, of `generate_members`.

  `weights` is the model as `forward` takes it (params, low-rank deltas, delta_scale);
  `decoding` a `sampling.Decoding` with `unroll_layers` decided (`sampling.resolved`).
  Member mode: prompt_ids/prompt_mask are [M, P, S], `key` holds M keys, and `member_axes` is
  `split_axes` of the `Member` of in_axes (es_jax.es.member_axes). The loop runs over the M * P
  rows as one batch (one unbatched while loop: a vmapped loop would carry a per-row predicate
  and select the whole KV cache every step); only the model call is vmapped over the members.
  `decoding.kv_chunk` and `decoding.compactions`: see the module docstring (None and 0: every
  step reads the whole cache for every row until the longest row ends). `row_groups` (plain
  mode): rows are compacted within contiguous groups of B / row_groups rows, e.g. one per
  device the batch is sharded over, so that compaction moves no row between devices.
  `decoding.prefill_rows` (plain mode): the prompts' runs of equal rows are prefilled once each
  (`prompt_runs`) and their cache rows and logits copied to the runs' rows.
  """
  max_new_tokens, pad_id = decoding.max_new_tokens, decoding.pad_id
  # One cast before the loop, not one per step.
  weights = Member(*weights)._replace(params=cast_params(weights[0], config.jnp_dtype))
  member_mode = member_axes is not None
  M = prompt_ids.shape[0] if member_mode else row_groups  # groups rows are compacted within
  prompt_ids, prompt_mask = (x.reshape(-1, x.shape[-1]) for x in (prompt_ids, prompt_mask))
  B, S = prompt_ids.shape
  P = B // M
  slots, chunk = cache_length(S, max_new_tokens, decoding.kv_chunk)
  axes = Member(None, None, None)
  if member_mode:
    leaves, treedef = member_axes
    axes = treedef.unflatten(leaves)
  model = _model_call(config, M if member_mode else None, chunk)
  members = M if member_mode else None
  shared = decoding.prefill_rows is not None and decoding.prefill_rows < B and not member_mode
  if shared:  # each run of equal prompt rows prefilled once, then copied to its rows
    first, run = prompt_runs(prompt_ids, prompt_mask, decoding.prefill_rows)
    prompts = (prompt_ids[first], prompt_mask[first])
  else:
    prompts = (prompt_ids, prompt_mask)
  logits, (weights, axes), cache = _prefill(
    model, (weights, axes), *prompts, config, members, slots, decoding.unroll_layers
  )
  if shared:
    logits, cache = logits[run], take_rows(cache, run)
  sample = functools.partial(_pick, key=key, rows=P, member_mode=member_mode, decoding=decoding)
  eos = jnp.asarray(decoding.eos_ids or (-1,), jnp.int32)
  emit = functools.partial(_emit, pick=sample, eos=eos, pad_id=pad_id, rows=P)

  def body(state: _Rows) -> _Rows:
    # Feed step t-1's tokens, then emit step t's: max_new_tokens - 1 forwards after the prefill.
    tok, live, t = state.tok[:, None], state.live[:, None], state.t
    positions = (state.prompt_len + t - 1)[:, None]
    logits, cache = model(weights, axes, tok, positions, live, state.cache, S + t - 1)
    return emit(state._replace(cache=cache), logits)

  state = emit(_start(cache, prompt_mask, M, max_new_tokens, pad_id), logits)
  sizes = phase_sizes(P, decoding.compactions)
  for k, size in enumerate(sizes):
    if k:
      state = _compact(state, M, size, member_mode)
    state = jax.lax.while_loop(_running(max_new_tokens, M, sizes[k + 1 :]), body, state)
  if not member_mode:
    return state.out
  return jax.tree.map(lambda x: x.reshape(M, P, *x.shape[1:]), state.out)


def _model_call(config: ModelConfig, members: int | None, chunk: int | None):
  """`forward` on a block of the loop's rows; in member mode vmapped over the M members (rows
  member-major, the `Member` weights with the `Member` of in_axes `axes`)."""
  fwd = functools.partial(forward, config=config)

  def model(weights, axes, tokens, positions, mask, cache, cache_index, last_only=False):
    def one(w, tok, pos, m, c):
      p, d, scale = w
      mode = ForwardMode(c, cache_index, chunk, last_only)
      return fwd(p, tok, pos, mask=m, deltas=d, delta_scale=scale, mode=mode)

    if members is None:
      return one(weights, tokens, positions, mask, cache)
    split = lambda x: x.reshape(members, -1, *x.shape[1:])  # noqa: E731
    logits, cache = jax.vmap(one, in_axes=(axes, 0, 0, 0, 0))(
      weights, split(tokens), split(positions), split(mask), cache
    )
    return logits.reshape(-1, *logits.shape[2:]), cache

  return model


def _prefill(model, weights, prompt_ids, prompt_mask, config, members, slots, unroll_layers):
  """Runs the prompts into a fresh cache of `slots` slots. `weights`: (the `Member`, its
  `Member` of in_axes). Returns (last logits [B, 1, V], (member, axes) in the layout the decode
  steps use, cache)."""
  (params, deltas, scale), axes = weights
  B, S = prompt_ids.shape
  if members is None:
    cache = init_cache(config, B, slots)
  else:
    cache = jax.vmap(lambda _: init_cache(config, B // members, slots))(jnp.arange(members))

  def unstacked(cache):
    return unstack_cache(cache) if members is None else jax.vmap(unstack_cache)(cache)

  # Layers given unstacked (`unstack_layers`, e.g. built so by the ES population, which then holds
  # no stacked copy) run unrolled from the prefill on.
  given_unstacked = isinstance(params["layers"], (tuple, list))
  if given_unstacked:
    cache = unstacked(cache)
  positions = jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)
  logits, cache = model(
    Member(params, deltas, scale), axes, prompt_ids, positions, prompt_mask, cache, 0, True
  )
  if unroll_layers and not given_unstacked:
    # Decode over per-layer copies of the weights (made once here; the barrier keeps XLA from
    # sinking the slices back into the loop, where they would be redone every step).
    if members is None:
      params, deltas = unstack_layers(params), None if deltas is None else unstack_layers(deltas)
    else:
      (params, p_axes), (deltas, d_axes) = (
        axes_lib.unstack_member_layers(params, axes.params, config.num_layers),
        axes_lib.unstack_member_layers(deltas, axes.deltas, config.num_layers),
      )
      axes = axes._replace(params=p_axes, deltas=d_axes)
    params, deltas = jax.lax.optimization_barrier((params, deltas))
    cache = unstacked(cache)
  return logits, (Member(params, deltas, scale), axes), cache


def prompt_runs(prompt_ids, prompt_mask, runs: int):
  """(first row of each run [runs], run of each row [B]) of the runs of adjacent equal rows of
  prompts [B, S] (equal ids and mask); unused runs point at row 0. At most `runs` runs (static):
  rows past them are read as the last run's (the caller checks the count where it can)."""
  same = jnp.all(prompt_ids[1:] == prompt_ids[:-1], axis=1)
  same &= jnp.all(prompt_mask[1:] == prompt_mask[:-1], axis=1)
  start = jnp.concatenate([jnp.ones((1,), bool), ~same])  # [B]
  run = jnp.minimum(jnp.cumsum(start) - 1, runs - 1)
  (first,) = jnp.nonzero(start, size=runs, fill_value=0)
  return first, run


def row_uniform(key, t):
  """The draw at step t of a row decoded with its own key: ``uniform(fold_in(key, t), (1,))[0]``,
  what `generate` draws for a one-row batch (and for row r of a batch given one key per row)."""
  return jax.random.uniform(jax.random.fold_in(key, t), (1,))[0]


def _pick(t, logits, row, *, key, rows, member_mode, decoding):
  """Step t's tokens from logits [B', V]. Row r of group (member) m draws
  ``uniform(fold_in(key_m, t), (P,))[r]``, with one key for all groups outside member mode
  (``uniform(fold_in(key, t), (M * P,))`` split by group): the static loop's draw for the row.
  Outside member mode `key` may also hold one key per row ([B]): row r draws
  ``row_uniform(key[r], t)``."""
  if decoding.greedy:
    return token_sampling.argmax(logits)
  groups = row.shape[0]  # row [M, P'] holds original rows of P per group
  if member_mode:
    u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, t), (rows,)))(key)
  elif key.ndim and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # one typed key per row
    u = jax.vmap(row_uniform, in_axes=(0, None))(key, t).reshape(groups, rows)
  else:
    u = jax.random.uniform(jax.random.fold_in(key, t), (groups * rows,)).reshape(groups, rows)
  u = jnp.take_along_axis(u, row, axis=1).reshape(-1)
  return token_sampling.sample_from_uniform(
    logits, u, decoding.temperature, decoding.top_p, use_top_p=decoding.use_top_p
  )


def _emit(state: _Rows, logits, *, pick, eos, pad_id: int, rows: int) -> _Rows:
  """Picks step t's tokens from logits [B', 1, V] and records them in their original rows."""
  logits = logits[:, -1]  # [B', V]
  t, out = state.t, state.out
  tok = pick(t, logits, state.row)
  logp, ent = token_sampling.logprob_and_entropy(logits, tok)
  live = ~state.done
  tok = jnp.where(live, tok, pad_id)
  at = (jnp.arange(state.row.shape[0])[:, None] * rows + state.row).reshape(-1)  # [B'] original
  out = Completions(
    tokens=out.tokens.at[at, t].set(tok),
    logprobs=out.logprobs.at[at, t].set(jnp.where(live, logp, 0.0)),
    entropy=out.entropy.at[at, t].set(jnp.where(live, ent, 0.0)),
    mask=out.mask.at[at, t].set(live),
    lengths=out.lengths.at[at].add(live.astype(jnp.int32)),
  )
  done = state.done | jnp.isin(tok, eos)
  return state._replace(t=t + 1, tok=tok, live=live, done=done, out=out)


def _start(cache, prompt_mask, groups: int, max_new_tokens: int, pad_id: int) -> _Rows:
  """The loop state before step 0: every row live, in its own place."""
  B = prompt_mask.shape[0]
  return _Rows(
    t=jnp.int32(0),
    cache=cache,
    tok=jnp.zeros((B,), jnp.int32),
    live=jnp.zeros((B,), bool),
    done=jnp.zeros((B,), bool),
    row=jnp.broadcast_to(jnp.arange(B // groups, dtype=jnp.int32), (groups, B // groups)),
    prompt_len=jnp.sum(prompt_mask, axis=-1).astype(jnp.int32),
    out=_empty(B, max_new_tokens, pad_id),
  )


def _empty(rows: int, max_new_tokens: int, pad_id: int) -> Completions:
  return Completions(
    tokens=jnp.full((rows, max_new_tokens), pad_id, jnp.int32),
    logprobs=jnp.zeros((rows, max_new_tokens), jnp.float32),
    entropy=jnp.zeros((rows, max_new_tokens), jnp.float32),
    mask=jnp.zeros((rows, max_new_tokens), bool),
    lengths=jnp.zeros((rows,), jnp.int32),
  )


def _running(max_new_tokens: int, members: int, later: tuple[int, ...]):
  """A phase's loop condition: budget left and a row unfinished, and (unless it is the last
  phase) some member with more unfinished rows than the next phase holds."""

  def cond(state: _Rows):
    unfinished = jnp.sum(~state.done.reshape(members, -1), axis=1)  # [M]
    go = (state.t < max_new_tokens) & jnp.any(unfinished > 0)
    return go & (jnp.max(unfinished) > later[0]) if later else go

  return cond


def _compact(state: _Rows, groups: int, size: int, member_mode: bool) -> _Rows:
  """The state with each group's (member's) rows cut to `size`: its unfinished rows first (in
  order), then finished ones. The dropped rows are all finished (the previous phase ran until
  they were). Rows move only within their group (a batched gather over the groups)."""
  done = state.done.reshape(groups, -1)
  keep = jnp.argsort(done.astype(jnp.int32), axis=1, stable=True)[:, :size]  # [G, size]
  take = lambda x: jnp.take_along_axis(x.reshape(groups, -1), keep, axis=1).reshape(-1)  # noqa: E731
  if member_mode:
    cache = jax.vmap(take_rows)(state.cache, keep)
  else:
    cache = take_group_rows(state.cache, keep)
  return state._replace(
    cache=cache,
    tok=take(state.tok),
    live=take(state.live),
    done=take(state.done),
    row=jnp.take_along_axis(state.row, keep, axis=1),
    prompt_len=take(state.prompt_len),
  )
