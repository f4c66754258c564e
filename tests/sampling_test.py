"""Sampler tests: against transformers' greedy decode and full forwards, decode paths, members
and sharding (token-level sampling statistics: tests/token_sampling_test.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from tiny_models import es_jax_port, torch_model, transformers_greedy

from es_jax.decode.loop import decode
from es_jax.decode.queue import generate_queue
from es_jax.decode.sampling import Decoding, generate, generate_members, pad_prompts
from es_jax.es.member_axes import Member
from es_jax.models import forward, positions_from_mask, unstack_layers

EOS = 255


@pytest.fixture(scope="module")
def tiny():
  """A tiny random Llama as (torch reference, es_jax params, config)."""
  ref = torch_model("llama")
  return ref, *es_jax_port(ref)


def _prompts():
  return pad_prompts([[5, 17, 99, 3], [42, 7], [1, 2, 3, 4, 5, 6, 7]], pad_id=0, bucket=8)


# The quick tier compares the default layout with transformers; the other layouts equal it there
# (decode_loop_test.py::test_loop_layouts_give_the_static_loops_tokens).
@pytest.mark.parametrize(
  "loop",
  [
    {},
    pytest.param(dict(kv_chunk=None, compactions=0), marks=pytest.mark.slow),
    pytest.param(dict(kv_chunk=4, compactions=2), marks=pytest.mark.slow),
  ],
  ids=["default", "static", "bucketed"],
)
def test_greedy_matches_transformers_generate(tiny, loop):
  ref, p, cfg = tiny
  ids, mask = _prompts()
  out = generate(p, ids, mask, Decoding(12, **loop), config=cfg, key=jax.random.key(0))
  expected = transformers_greedy(ref, ids, mask, 12)
  np.testing.assert_array_equal(np.asarray(out.tokens), expected)
  assert np.asarray(out.mask).all() and (np.asarray(out.lengths) == 12).all()


def test_queue_greedy_matches_transformers_generate(tiny):
  """The queue decoder (3 prompts through 2 rows, refilled one at a time, bucketed reads)."""
  ref, p, cfg = tiny
  ids, mask = _prompts()
  decoding = Decoding(12, refill_rows=1, kv_chunk=4)
  out = generate_queue(p, ids, mask, decoding, config=cfg, key=jax.random.key(0), rows=2)
  expected = transformers_greedy(ref, ids, mask, 12)
  np.testing.assert_array_equal(np.asarray(out.tokens), expected)


def _full_forward_logprobs(p, cfg, ids, mask, out):
  """log_softmax of one full forward over prompt + completion, at the generated tokens."""
  T = out.tokens.shape[1]
  seq = jnp.concatenate([jnp.asarray(ids), out.tokens], axis=1)
  seq_mask = jnp.concatenate([jnp.asarray(mask), out.mask], axis=1)
  logits, _ = forward(p, seq, positions_from_mask(seq_mask), config=cfg, mask=seq_mask)
  logp_all = jax.nn.log_softmax(logits[:, ids.shape[1] - 1 : -1], axis=-1)  # [B, T, V]
  logp = jnp.take_along_axis(logp_all, out.tokens[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy, T


def test_sampled_logprobs_and_entropy_equal_full_forward(tiny):
  _, p, cfg = tiny
  ids, mask = _prompts()
  out = generate(p, ids, mask, Decoding(10, 1.0, 0.9), config=cfg, key=jax.random.key(1))
  logp, entropy, _ = _full_forward_logprobs(p, cfg, ids, mask, out)
  m = np.asarray(out.mask)
  np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(logp)[m], atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.entropy)[m], np.asarray(entropy)[m], atol=1e-4)
  assert np.asarray(out.entropy)[m].min() > 0.1  # sampling, not a collapsed distribution


@pytest.mark.slow
def test_eos_stops_and_masks(tiny):
  _, p, cfg = tiny
  ids, mask = _prompts()
  free = generate(p, ids, mask, Decoding(8, 1.0), config=cfg, key=jax.random.key(2))
  # Use the token row 0 emits at step 2 as EOS: row 0 must stop right after it.
  eos = int(free.tokens[0, 2])
  out = generate(
    p, ids, mask, Decoding(8, 1.0, eos_ids=[eos], pad_id=7), config=cfg, key=jax.random.key(2)
  )
  toks, m, lengths = map(np.asarray, (out.tokens, out.mask, out.lengths))
  np.testing.assert_array_equal(lengths, m.sum(1))
  for b in range(toks.shape[0]):
    hits = np.flatnonzero(toks[b] == eos)
    stop = hits[0] + 1 if hits.size else toks.shape[1]
    assert lengths[b] == stop
    assert m[b, :stop].all() and not m[b, stop:].any()
    assert (toks[b, stop:] == 7).all()
    assert (np.asarray(out.logprobs)[b, stop:] == 0).all()
  assert lengths[0] == 3
  # Until EOS, the tokens are the same draws as without EOS.
  np.testing.assert_array_equal(toks[0, :3], np.asarray(free.tokens)[0, :3])


def test_decode_paths_agree(tiny):
  """Greedy-only vs traced-temperature programs, unrolled vs scanned layers, with deltas."""
  _, p, cfg = tiny
  ids, mask = _prompts()
  keys = iter(jax.random.split(jax.random.key(8), 8))

  def factors(w):
    return (
      jax.random.normal(next(keys), (*w.shape[:-1], 2)),
      jax.random.normal(next(keys), (*w.shape[:-2], w.shape[-1], 2)),
    )

  deltas = {
    "embed": factors(p["embed"]),
    "layers": {k: factors(p["layers"][k]) for k in ("wq", "wv", "w_down")},
  }
  kw = dict(config=cfg, key=jax.random.key(0), deltas=deltas, delta_scale=0.01)
  runs = [
    generate(p, ids, mask, Decoding(8, 0.0, unroll_layers=True), **kw),
    generate(p, ids, mask, Decoding(8, jnp.float32(0.0), unroll_layers=True), **kw),
    generate(p, ids, mask, Decoding(8, 0.0, unroll_layers=False), **kw),
    # Layers handed over unstacked (as the ES population does) run unrolled from the prefill on.
    generate(unstack_layers(p), ids, mask, Decoding(8, 0.0, unroll_layers=False), **kw),
  ]
  for other in runs[1:]:
    np.testing.assert_array_equal(np.asarray(other.tokens), np.asarray(runs[0].tokens))
    np.testing.assert_allclose(np.asarray(other.logprobs), np.asarray(runs[0].logprobs), atol=1e-5)
    np.testing.assert_allclose(np.asarray(other.entropy), np.asarray(runs[0].entropy), atol=1e-5)
  sampled = [generate(p, ids, mask, Decoding(8, 1.0, 0.9, unroll_layers=u), **kw) for u in (1, 0)]
  np.testing.assert_array_equal(np.asarray(sampled[0].tokens), np.asarray(sampled[1].tokens))


@pytest.mark.slow
def test_no_retrace_on_second_call(tiny):
  _, p, cfg = tiny
  ids, mask = _prompts()
  generate(p, ids, mask, Decoding(4, 0.5, 0.95), config=cfg, key=jax.random.key(0))
  before = decode._cache_size()
  ids2 = np.asarray(ids)[::-1].copy()  # new values, same shapes; new temperature value
  generate(p, ids2, mask[::-1].copy(), Decoding(4, 0.9, 0.95), config=cfg, key=jax.random.key(9))
  assert decode._cache_size() == before


def test_decoding_validates_once_and_keeps_its_static_structure():
  """Greedy and no-nucleus are structure (None leaves); temperature and top-p values are leaves."""
  d = Decoding(np.int64(8), 0.0, 0.9, eos_ids=[np.int32(2)], pad_id=np.int32(1))
  assert (d.max_new_tokens, d.eos_ids, d.pad_id) == (8, (2,), 1)
  assert type(d.max_new_tokens) is int and d.greedy and d.top_p is None  # greedy drops top-p
  assert jax.tree.leaves(d) == []
  assert Decoding(8, 0.7, 1.0).top_p is None  # top_p >= 1 is no nucleus
  sampled = [Decoding(8, t, 0.9, eos_ids=(2,)) for t in (0.5, 0.9)]
  assert jax.tree.leaves(sampled[0]) == [0.5, 0.9]
  same = {jax.tree.structure(x) for x in sampled}
  assert len(same) == 1 and jax.tree.structure(d) not in same
  assert jax.tree.structure(Decoding(8, 0.5)) not in same  # top-p on/off: a static switch
  laid_out = Decoding(8, 0.5, 0.9, kv_chunk=np.int64(4), compactions=2)  # static: structure
  assert (laid_out.kv_chunk, laid_out.compactions) == (4, 2) and type(laid_out.kv_chunk) is int
  assert jax.tree.structure(laid_out) not in same and jax.tree.leaves(laid_out) == [0.5, 0.9]
  assert jax.tree.unflatten(jax.tree.structure(laid_out), [0.5, 0.9]) == laid_out
  # Under jit the leaves are tracers; the static part rides along unchanged.
  out = jax.jit(lambda x: x.temperature * 2)(sampled[0])
  assert float(out) == 1.0
  bad = [
    (dict(max_new_tokens=0), "Decoding.max_new_tokens=0"),
    (dict(max_new_tokens=2.5), "Decoding.max_new_tokens=2.5 must be an int"),
    (dict(max_new_tokens=4, temperature=-1.0), "Decoding.temperature=-1.0"),
    (dict(max_new_tokens=4, temperature=float("nan")), "Decoding.temperature=nan"),
    (dict(max_new_tokens=4, temperature=1.0, top_p=0.0), r"Decoding.top_p=0.0 must be in \(0, 1\]"),
    (dict(max_new_tokens=4, temperature=1.0, top_p=1.5), "Decoding.top_p=1.5"),
    (dict(max_new_tokens=4, kv_chunk=0), "Decoding.kv_chunk=0 must be a positive"),
    (dict(max_new_tokens=4, compactions=-1), "Decoding.compactions=-1 must be"),
  ]
  for kw, match in bad:
    with pytest.raises(ValueError, match=match):
      Decoding(**kw)


def test_vmap_over_params_equals_individual_calls(tiny):
  _, p, cfg = tiny
  ids, mask = _prompts()
  p2 = jax.tree.map(lambda x: x * 1.05, p)
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), p, p2)
  keys = jax.random.split(jax.random.key(5), 2)

  def run(params, key):
    return generate(params, ids, mask, Decoding(6, 1.0), config=cfg, key=key)

  batched = jax.vmap(run)(stacked, keys)
  for i, single_params in enumerate([p, p2]):
    single = run(single_params, keys[i])
    np.testing.assert_array_equal(np.asarray(batched.tokens[i]), np.asarray(single.tokens))
    np.testing.assert_allclose(
      np.asarray(batched.logprobs[i]), np.asarray(single.logprobs), atol=1e-5
    )


def _partly_per_member(p, scales):
  """Params with wq, attn_norm and final_norm per member (scaled copies), the rest shared."""
  M = scales.shape[0]
  own = {"wq", "attn_norm"}
  params = {
    **p,
    "final_norm": scales[:, None] * p["final_norm"],
    "layers": {
      k: (scales.reshape(M, 1, 1, *([1] * (v.ndim - 2))) * v if k in own else v)
      for k, v in p["layers"].items()
    },
  }
  params_axes = jax.tree.map(lambda _: None, p)
  params_axes["final_norm"] = 0
  params_axes["layers"] = {k: (0 if k in own else None) for k in p["layers"]}
  return params, params_axes


@pytest.mark.parametrize("unroll_layers", [True, False])
def test_generate_members_equals_per_member_generate(tiny, unroll_layers):
  """M models as one batch (shared/per-member leaves, low-rank deltas and keys, top-p, an early
  EOS) equal one `generate` call per member."""
  _, p, cfg = tiny
  ids, mask = _prompts()
  M = 3
  keys = iter(jax.random.split(jax.random.key(11), 16))
  params, params_axes = _partly_per_member(p, jnp.array([1.0, 1.1, 0.9]))

  def factors(w):
    return (
      jax.random.normal(next(keys), (M, *w.shape[:-1], 2)),
      jax.random.normal(next(keys), (M, *w.shape[:-2], w.shape[-1], 2)),
    )

  deltas = {"embed": factors(p["embed"]), "layers": {k: factors(p["layers"][k]) for k in ("wv",)}}
  member_keys = jax.random.split(jax.random.key(3), M)
  decoding = dict(max_new_tokens=8, temperature=1.0, top_p=0.9, pad_id=7)
  decoding.update(unroll_layers=unroll_layers)
  kw = dict(config=cfg, delta_scale=0.05)

  def member(tree, axes, i):  # sliced in numpy: no eager slice program per leaf shape
    return jax.tree.map(
      lambda a, x: x if a is None else np.asarray(x)[i], axes, tree, is_leaf=lambda a: a is None
    )

  def single(i, **extra):
    return generate(
      member(params, params_axes, i),
      ids,
      mask,
      Decoding(**decoding, **extra),
      key=member_keys[i],
      deltas=jax.tree.map(lambda x: np.asarray(x)[i], deltas),
      **kw,
    )

  eos = int(single(1).tokens[0, 2])  # member 1's row 0 stops after step 2
  together = generate_members(
    Member(params, deltas, 0.05),
    Member(params_axes, jax.tree.map(lambda _: 0, deltas), None),
    ids,
    mask,
    Decoding(**decoding, eos_ids=[eos]),
    keys=member_keys,
    config=cfg,
  )
  together = jax.tree.map(np.asarray, together)
  assert together.tokens.shape == (M, *np.asarray(ids).shape[:1], 8)
  assert int(together.lengths[1, 0]) == 3
  for i in range(M):
    ref = single(i, eos_ids=[eos])
    np.testing.assert_array_equal(np.asarray(together.tokens[i]), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(together.mask[i]), np.asarray(ref.mask))
    np.testing.assert_array_equal(np.asarray(together.lengths[i]), np.asarray(ref.lengths))
    for field in ("logprobs", "entropy"):
      got_i, want = getattr(together, field)[i], getattr(ref, field)
      np.testing.assert_allclose(np.asarray(got_i), np.asarray(want), atol=1e-5)
  assert not np.array_equal(np.asarray(together.tokens[0]), np.asarray(together.tokens[2]))

  # Every leaf per member, layers handed over unstacked (the full-rank population's form).
  full = jax.tree.map(
    lambda a, x: x if a == 0 else jnp.stack([x] * M),
    params_axes,
    params,
    is_leaf=lambda a: a is None,
  )
  unstacked = jax.vmap(unstack_layers)(full)
  got = generate_members(
    Member(unstacked, deltas, 0.05),
    Member(jax.tree.map(lambda _: 0, unstacked), jax.tree.map(lambda _: 0, deltas), None),
    ids,
    mask,
    Decoding(**decoding),
    keys=member_keys,
    config=cfg,
  )
  got_tokens = np.asarray(got.tokens)
  for i in range(M):
    np.testing.assert_array_equal(got_tokens[i], np.asarray(single(i).tokens))


def test_generate_members_names_bad_member_axes(tiny):
  _, p, cfg = tiny
  ids, mask = _prompts()
  call = dict(keys=jax.random.split(jax.random.key(3), 3), config=cfg)

  def run(params_axes):
    return generate_members(Member(p), Member(params_axes), ids, mask, Decoding(2), **call)

  with pytest.raises(ValueError, match=r"params\['embed'\] has shape .* per member"):
    run(jax.tree.map(lambda _: 0, p))
  with pytest.raises(ValueError, match="params_axes must mirror params"):
    run({"embed": None})
  with pytest.raises(ValueError, match=r"params_axes at params\['final_norm'\] is 1"):
    run({**jax.tree.map(lambda _: None, p), "final_norm": 1})


def test_prompt_batch_sharded_over_devices_equals_single_device(tiny):
  _, p, cfg = tiny
  assert jax.device_count() == 8
  rng = np.random.RandomState(0)
  ids, mask = pad_prompts([list(rng.randint(0, 250, n)) for n in range(1, 9)], pad_id=0, bucket=8)
  mesh = jax.make_mesh((8,), ("pop",), axis_types=(jax.sharding.AxisType.Auto,))
  row = NamedSharding(mesh, PartitionSpec("pop"))
  kw = dict(config=cfg, key=jax.random.key(6))
  sharded = generate(p, jax.device_put(ids, row), jax.device_put(mask, row), Decoding(5, 1.0), **kw)
  single = generate(p, ids, mask, Decoding(5, 1.0), **kw)
  assert len(sharded.tokens.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))


def test_pad_prompts_buckets_and_left_pads():
  ids, mask = pad_prompts([[1, 2, 3], [4]], pad_id=9, bucket=4)
  np.testing.assert_array_equal(ids, [[9, 1, 2, 3], [9, 9, 9, 4]])
  np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1]])
  assert pad_prompts([[1] * 5], pad_id=0, bucket=4)[0].shape == (1, 8)
  with pytest.raises(ValueError, match="no prompts"):
    pad_prompts([], pad_id=0)
