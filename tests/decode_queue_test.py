"""Queue decoder tests: work items through fewer rows give each item the tokens it gets decoded
alone, whatever the rows, refill size, order and neighbours; rows refill as items end."""

import functools

import jax
import numpy as np
import pytest
from tiny_models import es_jax_port, torch_model

from es_jax.decode import loop as decode_loop
from es_jax.decode import sampling
from es_jax.decode.queue import decode_queue, generate_queue
from es_jax.decode.sampling import Decoding, generate, pad_prompts

PROMPTS = [[5, 17, 99, 3], [42, 7], [1, 2, 3, 4, 5, 6, 7], [9, 9], [200, 3, 3], [64], [3, 1]]
PROMPTS += [[8, 8, 8], [100, 2], [77, 12, 13]]  # W = 10 work items
W = len(PROMPTS)
T = 12


@functools.cache
def _tiny():
  return es_jax_port(torch_model("llama"))


@pytest.fixture(scope="module")
def tiny():
  return _tiny()


def _keys(n=W, seed=5):
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), np.arange(n))


def _kw(temperature, eos_ids=(), **layout):
  """The decode settings (`Decoding`) of these tests, laid out by `layout`."""
  return Decoding(T, temperature, 0.95 if temperature else None, eos_ids, pad_id=1, **layout)


@functools.cache
def _eos():
  """Stop tokens (from a free sampled run) that end items at several lengths, some never."""
  p, cfg = _tiny()
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  free = np.asarray(generate(p, ids, mask, _kw(1.0), config=cfg, key=_keys()).tokens)
  picks = [(0, 1), (1, 3), (2, 5), (3, 4), (4, 2), (5, 7), (6, 1), (8, 2)]  # (item, token)
  return tuple(sorted({int(free[i, j]) for i, j in picks}))


def _alone(tiny, prompts, keys, temperature, eos_ids=()):
  """Each item decoded by the static loop as a batch of its own (one row, its key)."""
  p, cfg = tiny
  outs = []
  for prompt, key in zip(prompts, keys, strict=True):
    ids, mask = pad_prompts([prompt], pad_id=0, bucket=8)
    outs.append(generate(p, ids, mask, _kw(temperature, eos_ids), config=cfg, key=key))
  return jax.tree.map(lambda *x: np.concatenate([np.asarray(y) for y in x]), *outs)


def _queue(tiny, prompts, keys, temperature, eos_ids=(), *, rows, max_tokens=None, **layout):
  p, cfg = tiny
  ids, mask = pad_prompts(prompts, pad_id=0, bucket=8)
  decoding = _kw(temperature, eos_ids, **layout)
  return generate_queue(
    p, ids, mask, decoding, config=cfg, key=keys, rows=rows, max_tokens=max_tokens
  )


def _assert_same(out, ref, rows=slice(None)):
  for name in ("tokens", "mask", "lengths"):
    np.testing.assert_array_equal(np.asarray(getattr(out, name))[rows], getattr(ref, name))
  for name in ("logprobs", "entropy"):
    np.testing.assert_allclose(np.asarray(getattr(out, name))[rows], getattr(ref, name), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_items_get_their_own_decode_whatever_the_rows(tiny, temperature):
  """B = 2, 4 (W = 10 not a multiple), 8 rows, refills of 1 to B items, dense and chunked
  cache reads: every item equals its own one-row static decode."""
  eos, keys = _eos(), _keys()
  alone = _alone(tiny, PROMPTS, keys, temperature, eos)
  lengths = alone.lengths
  assert lengths.min() < 6 and lengths.max() == T  # items end at different steps, some never
  layouts = [
    dict(rows=2, refill_rows=1),
    dict(rows=4, refill_rows=3, kv_chunk=4),
    dict(rows=8, refill_rows=2),
    dict(rows=4, refill_rows=4, kv_chunk=8),
    dict(rows=8, refill_rows=3, kv_chunk=4, compactions=2),
  ]
  if temperature == 0:  # greedy tokens use no draw: two layouts (one compacting) suffice
    layouts = layouts[1::3]
  for layout in layouts:
    _assert_same(_queue(tiny, PROMPTS, keys, temperature, eos, **layout), alone)


@pytest.mark.slow
def test_items_do_not_depend_on_their_order_or_neighbours(tiny):
  eos, keys = _eos(), _keys()
  base = _queue(tiny, PROMPTS, keys, 1.0, eos, rows=4, refill_rows=2)
  order = np.random.default_rng(0).permutation(len(PROMPTS))
  shuffled = _queue(tiny, [PROMPTS[i] for i in order], keys[order], 1.0, eos, rows=3)
  ref = jax.tree.map(lambda x: np.asarray(x)[order], base)
  _assert_same(shuffled, ref)
  some = [1, 4, 5, 9]  # fewer neighbours, other rows
  part = _queue(tiny, [PROMPTS[i] for i in some], keys[np.array(some)], 1.0, eos, rows=2)
  _assert_same(part, jax.tree.map(lambda x: np.asarray(x)[some], base))


@pytest.mark.slow
def test_one_key_gives_item_i_fold_in_key_i_and_generate_takes_row_keys(tiny):
  p, cfg = tiny
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  key, eos = jax.random.key(5), _eos()
  one = generate_queue(p, ids, mask, _kw(1.0, eos), config=cfg, key=key, rows=3)
  static = generate(p, ids, mask, _kw(1.0, eos), config=cfg, key=_keys())  # a key per row
  _assert_same(one, jax.tree.map(np.asarray, static))
  _assert_same(one, _alone(tiny, PROMPTS[:3], _keys()[:3], 1.0, eos), rows=slice(0, 3))


def _schedule(lengths, rows, refill, compactions):
  """(rows of each decode step, prefills) of the queue's refill and compaction rules, replayed
  in Python."""
  W, nxt, prefills, per_step = len(lengths), 0, 0, []
  left = [0] * rows  # tokens each row's item still has to emit after the current one

  def fill():
    nonlocal nxt, prefills
    while 0 < (n := min(refill, W - nxt)) <= sum(x == 0 for x in left):
      free = [r for r in range(rows) if left[r] == 0][:n]
      for r, i in zip(free, range(nxt, nxt + n), strict=True):
        left[r] = lengths[i] - 1
      nxt, prefills = nxt + n, prefills + 1

  fill()
  sizes = decode_loop.phase_sizes(rows, compactions)
  for k, size in enumerate(sizes):
    later = sizes[k + 1 :]
    while any(left) and (not later or nxt < W or sum(x > 0 for x in left) > later[0]):
      left = [max(x - 1, 0) for x in left]
      per_step.append(size)
      if k == 0:
        fill()
  return per_step, prefills


@pytest.mark.slow
@pytest.mark.parametrize(
  "rows,refill,compactions", [(4, 1, 0), (4, 2, 0), (3, 3, 0), (8, 3, 0), (8, 2, 3)]
)
def test_rows_refill_as_items_end(tiny, monkeypatch, rows, refill, compactions):
  """The loop runs the steps of the refill rule (replayed here from the items' lengths, with
  the rows of each step counted), fewer than static batches of `rows` items, each run until its
  longest item ends; compaction leaves the steps and tokens as they were."""
  p, cfg = tiny
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  decoding = _kw(1.0, _eos(), unroll_layers=True, refill_rows=refill, compactions=compactions)
  decoding = sampling.resolved(decoding, "test")
  rows_per_step = []
  real_forward = decode_loop.forward

  def counting_forward(params, tokens, *args, **kw):
    if tokens.shape[1] == 1:  # a decode step, not a prefill
      n = tokens.shape[0]
      jax.debug.callback(lambda: rows_per_step.append(n), ordered=True)
    return real_forward(params, tokens, *args, **kw)

  monkeypatch.setattr(decode_loop, "forward", counting_forward)
  decode_queue.clear_cache()  # trace again, through the counting forward
  budgets = np.full(W, T, np.int32)
  try:
    out, steps, prefills = decode_queue(
      p, ids, mask, _keys(), budgets, decoding, config=cfg, rows=rows
    )
    jax.effects_barrier()
  finally:
    decode_queue.clear_cache()
  lengths = np.asarray(out.lengths)
  assert (rows_per_step, int(prefills)) == _schedule(lengths.tolist(), rows, refill, compactions)
  assert int(steps) == len(rows_per_step)
  static = sum(lengths[i : i + rows].max() - 1 for i in range(0, len(lengths), rows))
  assert int(steps) < static
  if compactions:
    assert min(rows_per_step) < rows
    _assert_same(out, _alone(tiny, PROMPTS, _keys(), 1.0, _eos()))


@pytest.mark.slow
def test_items_all_ending_at_once_and_never_ending(tiny):
  """No EOS: every batch of rows ends together at the budget (equal to `generate`); every token
  an EOS: every item ends at its first token and no decode step runs."""
  p, cfg = tiny
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  never = _queue(tiny, PROMPTS, _keys(), 1.0, rows=4, refill_rows=2)
  _assert_same(
    never, jax.tree.map(np.asarray, generate(p, ids, mask, _kw(1.0), config=cfg, key=_keys()))
  )
  assert (np.asarray(never.lengths) == T).all()
  every = Decoding(T, 0.0, None, tuple(range(cfg.vocab_size)), 1, unroll_layers=True, refill_rows=3)
  budgets = np.full(len(PROMPTS), T, np.int32)
  out, steps, prefills = decode_queue(
    p, ids, mask, _keys(), budgets, sampling.resolved(every, "test"), config=cfg, rows=4
  )
  assert (np.asarray(out.lengths) == 1).all() and int(steps) == 0 and int(prefills) == 4


@pytest.mark.slow
def test_per_item_budgets_cut_items_short(tiny):
  eos, keys = _eos(), _keys()
  full = _alone(tiny, PROMPTS, keys, 1.0, eos)
  budgets = np.array([1, 2, 3, 12, 5, 6, 7, 8, 9, 4])
  out = _queue(tiny, PROMPTS, keys, 1.0, eos, rows=3, max_tokens=budgets)
  lengths = np.minimum(full.lengths, budgets)
  np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
  for i, n in enumerate(lengths):
    np.testing.assert_array_equal(np.asarray(out.tokens)[i, :n], full.tokens[i, :n])
    assert not np.asarray(out.mask)[i, n:].any()


@pytest.mark.slow
def test_bad_arguments_are_named(tiny):
  p, cfg = tiny
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  run = functools.partial(generate_queue, p, ids, mask, config=cfg)
  with pytest.raises(ValueError, match=r"generate_queue: key must be .* of shape \(\) or \(10,\)"):
    run(Decoding(4), rows=2, key=_keys(3))
  with pytest.raises(ValueError, match="refill_rows=3 must be at most rows=2"):
    run(Decoding(4, refill_rows=3), rows=2, key=jax.random.key(0))
  with pytest.raises(ValueError, match="max_tokens must be"):
    run(Decoding(4), rows=2, key=jax.random.key(0), max_tokens=np.ones(3, np.int32))
  with pytest.raises(ValueError, match="generate: key must be"):
    generate(p, ids, mask, Decoding(4), config=cfg, key=_keys(3))
  # A raw uint32 key (shape (2,)) is still one key for the whole batch, not one per row.
  kw = dict(config=cfg)
  raw = generate(p, ids[:2], mask[:2], Decoding(4, 1.0), key=jax.random.PRNGKey(3), **kw)
  typed = jax.random.wrap_key_data(jax.random.PRNGKey(3))
  typed = generate(p, ids[:2], mask[:2], Decoding(4, 1.0), key=typed, **kw)
  np.testing.assert_array_equal(np.asarray(raw.tokens), np.asarray(typed.tokens))
