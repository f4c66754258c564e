"""Decode-loop tests: the bucketed cache reads and row compaction change no token, and a row's
tokens do not depend on what else is in its batch."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from tiny_models import es_jax_port, torch_model

from es_jax.decode import loop as decode_loop
from es_jax.decode.loop import decode
from es_jax.decode.sampling import Decoding, generate, generate_members, pad_prompts, resolved
from es_jax.es.member_axes import Member


@functools.cache
def _tiny():
  return es_jax_port(torch_model("llama"))


@pytest.fixture(scope="module")
def tiny():
  return _tiny()


PROMPTS = [[5, 17, 99, 3], [42, 7], [1, 2, 3, 4, 5, 6, 7], [9, 9], [200, 3, 3], [64]]
STATIC = dict(kv_chunk=None, compactions=0)  # every step reads the whole cache for every row


def _run(tiny, prompts=PROMPTS, *, temperature, eos_ids=(), **loop):
  p, cfg = tiny
  ids, mask = pad_prompts(prompts, pad_id=0, bucket=8)
  decoding = Decoding(16, temperature, 0.95 if temperature else None, eos_ids, 1, **loop)
  return generate(p, ids, mask, decoding, config=cfg, key=jax.random.key(3))


@functools.cache
def _eos(temperature):
  """Stop tokens that end the first half of the rows by step 3 and the others later or never,
  so the loop has rows to drop (the tokens those rows emit at step 2 without stop tokens)."""
  free = _run(_tiny(), temperature=temperature, **STATIC)
  return tuple(sorted({int(t) for t in np.asarray(free.tokens)[: len(PROMPTS) // 2, 2]}))


def test_phase_sizes_and_cache_length():
  assert decode_loop.phase_sizes(8, 0) == (8,)
  assert decode_loop.phase_sizes(8, 2) == (8, 4, 2)
  assert decode_loop.phase_sizes(5, 5) == (5, 3, 2, 1)  # stops at one row
  assert decode_loop.cache_length(16, 40, None) == (56, None)
  assert decode_loop.cache_length(16, 40, 32) == (56, 48)  # the prompt and 32 slots
  assert decode_loop.cache_length(8, 12, 128) == (20, None)  # the whole cache: dense


# Sampled decoding runs every layout's code and the sampler too; greedy (the same loop with argmax
# for the draw) is the slow tier's.
@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_loop_layouts_give_the_static_loops_tokens(tiny, temperature):
  eos = _eos(temperature)
  static = _run(tiny, temperature=temperature, eos_ids=eos, **STATIC)
  lengths = np.asarray(static.lengths)
  assert lengths.min() <= 3 and lengths.max() > 3  # rows end at different steps
  for loop in (dict(kv_chunk=4, compactions=3), {}):
    out = _run(tiny, temperature=temperature, eos_ids=eos, **loop)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(static.tokens))
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(static.mask))
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
    for name in ("logprobs", "entropy"):
      np.testing.assert_allclose(
        np.asarray(getattr(out, name)), np.asarray(getattr(static, name)), atol=1e-5
      )


@pytest.mark.slow  # an invariance, no reference: the layouts' equivalence above stays quick
def test_a_rows_tokens_do_not_depend_on_its_batch(tiny):
  """Row r draws uniform(fold_in(key, t), (B,))[r]: the first rows decoded alone, or beside
  rows that end at other times (and leave the batch), get the same sampled tokens."""
  eos = _eos(1.0)
  full = _run(tiny, temperature=1.0, eos_ids=eos, kv_chunk=4, compactions=3)
  for n, loop in ((4, STATIC),):
    part = _run(tiny, PROMPTS[:n], temperature=1.0, eos_ids=eos, **loop)
    np.testing.assert_array_equal(np.asarray(part.tokens), np.asarray(full.tokens)[:n])
    np.testing.assert_array_equal(np.asarray(part.lengths), np.asarray(full.lengths)[:n])


@pytest.mark.slow
def test_members_compact_per_member(tiny):
  """Member mode compacts each member's rows; each member still equals its own generate."""
  p, cfg = tiny
  ids, mask = pad_prompts(PROMPTS, pad_id=0, bucket=8)
  eos = _eos(1.0)
  M = 2
  stacked = jax.tree.map(lambda x: jnp.stack([x, 1.05 * x]), p)
  keys = jax.random.split(jax.random.key(4), M)
  kw = dict(max_new_tokens=16, temperature=1.0, eos_ids=eos, pad_id=1)
  together = generate_members(
    Member(stacked),
    Member(jax.tree.map(lambda _: 0, p)),
    ids,
    mask,
    Decoding(**kw, kv_chunk=4, compactions=3),
    keys=keys,
    config=cfg,
  )
  for m in range(M):
    alone = generate(
      jax.tree.map(lambda x, m=m: x[m], stacked),
      ids,
      mask,
      Decoding(**kw, **STATIC),
      key=keys[m],
      config=cfg,
    )
    np.testing.assert_array_equal(np.asarray(together.tokens[m]), np.asarray(alone.tokens))
    np.testing.assert_array_equal(np.asarray(together.lengths[m]), np.asarray(alone.lengths))


@pytest.mark.slow
def test_finished_rows_leave_the_batch(tiny, monkeypatch):
  """The decode steps run on fewer rows once rows have ended (counted per executed step)."""
  eos = _eos(0.0)
  static = _run(tiny, temperature=0.0, eos_ids=eos, **STATIC)
  rows_per_step = []
  real_forward = decode_loop.forward

  def counting_forward(params, tokens, *args, **kw):
    rows = tokens.shape[0]
    jax.debug.callback(lambda: rows_per_step.append(rows), ordered=True)
    return real_forward(params, tokens, *args, **kw)

  monkeypatch.setattr(decode_loop, "forward", counting_forward)
  decode_loop.decode.clear_cache()  # trace again, through the counting forward
  try:
    _run(tiny, temperature=0.0, eos_ids=eos, kv_chunk=4, compactions=3)
  finally:
    decode_loop.decode.clear_cache()
  lengths = np.asarray(static.lengths)
  assert len(rows_per_step) == lengths.max()  # the prefill, then one call per later step
  sizes = decode_loop.phase_sizes(len(PROMPTS), 3)  # (6, 3, 2, 1)
  for step, rows in enumerate(rows_per_step[1:], start=1):
    unfinished = int((lengths > step).sum())  # rows that still emit at step `step`
    assert rows == min(s for s in sizes if s >= unfinished), (step, rows_per_step, lengths)
  assert min(rows_per_step) < len(PROMPTS)


def test_sharded_rows_compact_on_their_devices(tiny):
  """A batch sharded over 8 devices is compacted within each device's rows: the same tokens as
  on one device, and no collective moves cache-sized (4-d or larger) arrays between devices."""
  p, cfg = tiny
  prompts = PROMPTS + [[3, 1], [8, 8, 8], [100, 2], [77], [12, 13, 14], [250], [6, 6], [4, 40]]
  ids, mask = pad_prompts(prompts, pad_id=0, bucket=8)  # 14 rows: pad to 16 = 8 devices x 2
  ids, mask = np.concatenate([ids, ids[:2]]), np.concatenate([mask, mask[:2]])
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  rows = NamedSharding(mesh, PartitionSpec("pop"))
  kw = dict(config=cfg, key=jax.random.key(6))
  free = generate(p, ids, mask, Decoding(12, 1.0, pad_id=1, **STATIC), **kw)
  eos_ids = tuple(int(t) for t in np.asarray(free.tokens)[::2, 1])  # half the rows end
  single = generate(p, ids, mask, Decoding(12, 1.0, None, eos_ids, 1, **STATIC), **kw)
  assert np.asarray(single.lengths).min() <= 2
  sharded_ids, sharded_mask = jax.device_put(ids, rows), jax.device_put(mask, rows)
  laid_out = Decoding(12, 1.0, None, eos_ids, 1, kv_chunk=4, compactions=1)
  sharded = generate(p, sharded_ids, sharded_mask, laid_out, **kw)
  np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
  laid_out = resolved(laid_out.replace(unroll_layers=True), "test")
  args = (Member(p), sharded_ids, sharded_mask, kw["key"], laid_out)
  hlo = decode.lower(*args, config=cfg, row_groups=8).compile()
  moved = re.findall(r"\[\d+,\d+,\d+,\d+[^\]]*\][^\n]*? (?:all-reduce|all-gather)", hlo.as_text())
  assert not moved, moved[:3]
