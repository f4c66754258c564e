"""Continuous batching: W work items (prompts) decoded through B rows, a row that ends taking the
next waiting item, so the number of decode steps follows the tokens generated / B rather than
the longest completion of each batch of B.

Every row keeps its own length: its cache slots are the prompt's S left-padded slots, then one
slot per generated token, written at the row's own slot (`forward` with a cache index per row)
and read over the prompt's and the next `kv_chunk` slots while they hold the furthest row's.
Whenever at least R = `refill_rows` rows are free (fewer once fewer items wait), the next R
items are prefilled together into a fresh R-row cache, copied into the free rows, and emit their
first token; then every row takes one decode step. Shapes are static throughout: one compiled
prefill of R rows and one decode step of B rows, in a `lax.while_loop`. Once no item waits, the
last ones may finish in a batch that halves as rows go idle (`compactions` halvings, as in
`es_jax.decode.loop`; each compiles one more copy of the step).

Draws: work item i draws its token j with ``row_uniform(keys[i], j)``, a function of its key and
the token index only, so its tokens do not depend on B, R, the item order or its neighbours,
and equal `generate`'s for that prompt alone with key ``keys[i]`` (or for a batch given one key
per row), up to the float rounding of its logits in a batch of another size (XLA:CPU may round
a row differently, more so once the batch shrinks; see `es_jax.decode.loop`). Greedy tokens are
`generate`'s.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from es_jax import _checks
from es_jax.decode import sampling, token_sampling
from es_jax.decode.loop import (
  Completions,
  _empty,
  _model_call,
  cache_length,
  phase_sizes,
  row_uniform,
)
from es_jax.es.member_axes import Member
from es_jax.models.attention import KVCache, init_cache, take_rows, unstack_cache
from es_jax.models.config import ModelConfig
from es_jax.models.transformer import (
  Params,
  Transformer,
  cast_params,
  positions_from_mask,
  unstack_layers,
)
from es_jax.models.transformer import params as model_params


def generate_queue(
  params_or_model: Params | Transformer,
  prompt_ids,
  prompt_mask,
  decoding: sampling.Decoding,
  *,
  key: jax.Array,
  rows: int,
  config: ModelConfig | None = None,
  max_tokens=None,
) -> Completions:
  """Samples continuations of W left-padded prompts through `rows` rows (continuous batching).

  Args:
    params_or_model, config: as for `sampling.generate`.
    prompt_ids: [W, S] int, the work items, left-padded (`sampling.pad_prompts`).
    prompt_mask: [W, S] bool, False on padding.
    decoding: the decode settings (`sampling.Decoding`), as for `generate`; its
      `refill_rows` is R, items prefilled together once R rows are free (static; default
      B / 4), and its `compactions` the halvings of the batch once no item waits (module
      docstring).
    key: one PRNG key (item i draws with ``fold_in(key, i)``), or [W] typed PRNG keys, one per
      item (item i draws with ``key[i]``; module docstring).
    rows: B, rows decoded at once (static); more than W is cut to W.
    max_tokens: optional [W] ints, each item's own budget (at most `decoding.max_new_tokens`).

  Returns:
    Completions with leaves [W, max_new_tokens] ([W] lengths), in work-item order.
  """
  if isinstance(params_or_model, Transformer):
    config = params_or_model.config
    params_or_model = model_params(params_or_model)
  if config is None:
    raise ValueError("generate_queue: pass `config=` when giving a params dict instead of a model.")
  ids, mask = sampling._checked_prompts("generate_queue", prompt_ids, prompt_mask)
  W = ids.shape[0]
  sampling._check_keys("generate_queue", "key", key, (), (W,))
  if key.shape != (W,) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(W))
  B = min(_checks.positive_int(rows, "rows"), W)
  decoding = sampling.resolved(decoding, "generate_queue")
  R = max(B // 4, 1) if decoding.refill_rows is None else decoding.refill_rows
  if R > B:
    raise ValueError(f"generate_queue: Decoding.refill_rows={R} must be at most rows={B}.")
  T = decoding.max_new_tokens
  budgets = jnp.full((W,), T, jnp.int32) if max_tokens is None else jnp.asarray(max_tokens)
  if budgets.shape != (W,) or not jnp.issubdtype(budgets.dtype, jnp.integer):
    raise ValueError(f"generate_queue: max_tokens must be [W={W}] ints, got {budgets.shape}.")
  budgets = jnp.clip(budgets.astype(jnp.int32), 1, T)
  decoding = decoding.replace(refill_rows=R)
  out, _, _ = decode_queue(
    params_or_model, ids, mask, key, budgets, decoding, config=config, rows=B
  )
  return out


class _Queue(NamedTuple):
  """The loop state: B rows, W work items."""

  cache: KVCache  # of the B rows
  item: jax.Array  # [B] int32: the row's work item (stale once the row is inactive)
  j: jax.Array  # [B] int32: tokens the row's item has emitted
  tok: jax.Array  # [B] int32: the last emitted token
  active: jax.Array  # [B] bool: the row's item is still generating
  next: jax.Array  # () int32: the first waiting item
  steps: jax.Array  # () int32: decode steps run (prefills not counted)
  refills: jax.Array  # () int32: prefills run
  out: Completions  # [W, T], in work-item order


@functools.partial(
  jax.jit,
  # Static: the model structure and the row count decide the compiled program (as do
  # `decoding`'s static fields: budget, stop tokens, greedy, top-p on/off, layout).
  static_argnames=("config", "rows"),
)
def decode_queue(params, prompt_ids, prompt_mask, keys, budgets, decoding, *, config, rows: int):
  """The queue decode loop of `generate_queue` (module docstring). prompt_ids, prompt_mask
  [W, S]; keys [W] typed keys; budgets [W] int32 in [1, max_new_tokens], each item's cap;
  `decoding` a `sampling.Decoding` with `unroll_layers` and `refill_rows` (R <= rows) decided.

  Returns (Completions [W, T], decode steps run, prefills run).
  """
  params = _decode_weights(params, config, decoding.unroll_layers)
  unrolled = isinstance(params["layers"], (tuple, list))
  W, S = prompt_ids.shape
  B, R, T = rows, decoding.refill_rows, decoding.max_new_tokens
  slots, chunk = cache_length(S, T, decoding.kv_chunk)
  model = functools.partial(_model_call(config, None, chunk), Member(params), None)
  prompt_len = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)  # [W]
  emit = functools.partial(_emit, keys=keys, budgets=budgets, decoding=decoding)

  def fresh_cache(n):
    cache = init_cache(config, n, slots)
    return unstack_cache(cache) if unrolled else cache

  refill = functools.partial(
    _refill, model=model, fresh_cache=fresh_cache, prompts=(prompt_ids, prompt_mask), emit=emit, R=R
  )

  def fill(state: _Queue) -> _Queue:
    def room(state):
      n = jnp.minimum(R, W - state.next)
      return (n > 0) & (jnp.sum(~state.active) >= n)

    return jax.lax.while_loop(room, refill, state)

  def step(state: _Queue) -> _Queue:
    """One token for every active row: feed token j - 1 at slot S + j - 1, emit token j."""
    live, j = state.active, state.j
    slot = jnp.where(live, S + j - 1, S - 1)  # idle rows write a masked slot of their own
    pos = jnp.where(live, jnp.take(prompt_len, state.item) + j - 1, 0)
    logits, cache = model(state.tok[:, None], pos[:, None], live[:, None], state.cache, slot)
    items = jnp.where(live, state.item, W)
    out, tok, still = emit(state.out, logits[:, -1], items, j, live)
    return state._replace(
      cache=cache, tok=tok, j=j + live, active=still, steps=state.steps + 1, out=out
    )

  state = fill(_start(fresh_cache(B), _empty(W, T, decoding.pad_id)))
  sizes = phase_sizes(B, decoding.compactions)
  for k, size in enumerate(sizes):  # phase 0 refills; later ones only drain the last items
    if k:
      state = _compact(state, size)
    body = (lambda s: fill(step(s))) if k == 0 else step
    state = jax.lax.while_loop(_running(W, sizes[k + 1 :]), body, state)
  return state.out, state.steps, state.refills


def _start(cache: KVCache, out: Completions) -> _Queue:
  """The state before the first prefill: every row free, no item started."""
  zeros = jnp.zeros((cache.mask.shape[0],), jnp.int32)
  count = jnp.int32(0)
  return _Queue(cache, zeros, zeros, zeros, zeros.astype(bool), count, count, count, out)


def _running(W: int, later: tuple[int, ...]):
  """A phase's loop condition: some item unfinished, and (unless it is the last phase) items
  waiting or more active rows than the next phase holds."""

  def cond(state: _Queue):
    go = jnp.any(state.active)
    return go & ((state.next < W) | (jnp.sum(state.active) > later[0])) if later else go

  return cond


def _compact(state: _Queue, size: int) -> _Queue:
  """The state cut to `size` rows: the active ones (all of them: the previous phase ran until
  they fit), then idle ones."""
  keep = jnp.argsort((~state.active).astype(jnp.int32), stable=True)[:size]
  take = lambda x: jnp.take(x, keep, axis=0)  # noqa: E731
  return state._replace(
    cache=take_rows(state.cache, keep),
    item=take(state.item),
    j=take(state.j),
    tok=take(state.tok),
    active=take(state.active),
  )


def _decode_weights(params, config: ModelConfig, unroll_layers: bool):
  """params in the compute dtype, with per-layer copies when `unroll_layers` (made once; the
  barrier keeps XLA from sinking the slices into the loop, where they would be redone)."""
  params = cast_params(params, config.jnp_dtype)  # one cast before the loop, not one per step
  if unroll_layers and not isinstance(params["layers"], (tuple, list)):
    params = jax.lax.optimization_barrier(unstack_layers(params))
  return params


def _refill(state: _Queue, *, model, fresh_cache, prompts, emit, R: int) -> _Queue:
  """The next R waiting items (fewer at the end of the queue) prefilled together into a fresh
  cache, copied into the first free rows, each emitting its first token."""
  prompt_ids, prompt_mask = prompts
  W, B = prompt_ids.shape[0], state.item.shape[0]
  n = jnp.minimum(R, W - state.next)
  valid = jnp.arange(R) < n
  items = state.next + jnp.arange(R)  # [R]
  ids, mask = (jnp.take(x, jnp.minimum(items, W - 1), axis=0) for x in (prompt_ids, prompt_mask))
  logits, new = model(ids, positions_from_mask(mask), mask, fresh_cache(R), 0, last_only=True)
  free = jnp.argsort(state.active.astype(jnp.int32), stable=True)[:R]  # free rows first
  dest = jnp.where(valid, free, B)  # out of range: dropped
  out, tok, live = emit(state.out, logits[:, -1], items, jnp.zeros_like(items), valid)
  put = lambda x, y: x.at[dest].set(y, mode="drop")  # noqa: E731
  return state._replace(
    cache=_put_rows(state.cache, new, dest),
    item=put(state.item, items),
    j=put(state.j, jnp.ones_like(items)),
    tok=put(state.tok, tok),
    active=put(state.active, live),
    next=state.next + n,
    refills=state.refills + 1,
    out=out,
  )


def _put_rows(cache: KVCache, new: KVCache, dest) -> KVCache:
  """`cache` with its rows `dest` [R] (out of range: skipped) replaced by `new`'s R rows."""
  if isinstance(cache.k, tuple):
    put = lambda x, y: x.at[dest].set(y, mode="drop")  # noqa: E731
    k, v = tuple(map(put, cache.k, new.k)), tuple(map(put, cache.v, new.v))
  else:
    put = lambda x, y: x.at[:, dest].set(y, mode="drop")  # noqa: E731
    k, v = put(cache.k, new.k), put(cache.v, new.v)
  return KVCache(k, v, cache.mask.at[dest].set(new.mask, mode="drop"))


def _emit(out: Completions, logits, items, j, valid, *, keys, budgets, decoding):
  """Token j of each item in `items` [n] from logits [n, V], recorded in `out` where `valid`.
  Returns (out, tokens [n], whether each item goes on)."""
  W = out.tokens.shape[0]
  safe = jnp.minimum(items, W - 1)
  if decoding.greedy:
    tok = token_sampling.argmax(logits)
  else:
    u = jax.vmap(row_uniform)(keys[safe], j)
    t, p = decoding.temperature, decoding.top_p
    tok = token_sampling.sample_from_uniform(logits, u, t, p, use_top_p=decoding.use_top_p)
  logp, ent = token_sampling.logprob_and_entropy(logits, tok)
  tok = jnp.where(valid, tok, decoding.pad_id)
  at = jnp.where(valid, items, W)  # out of range: dropped
  out = Completions(
    tokens=out.tokens.at[at, j].set(tok, mode="drop"),
    logprobs=out.logprobs.at[at, j].set(logp, mode="drop"),
    entropy=out.entropy.at[at, j].set(ent, mode="drop"),
    mask=out.mask.at[at, j].set(True, mode="drop"),
    lengths=out.lengths.at[at].add(1, mode="drop"),
  )
  eos = jnp.asarray(decoding.eos_ids or (-1,), jnp.int32)
  ended = jnp.isin(tok, eos) | (j + 1 >= jnp.take(budgets, safe))
  return out, tok, valid & ~ended
