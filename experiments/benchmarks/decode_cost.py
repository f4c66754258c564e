"""Decode cost against the tokens generated: continuous batching vs the static decode loop.

    python -m experiments.benchmarks.decode_cost [--model smollm2] [--items 64] [--rows 16]
        [--refill_rows 4] [--compactions 2] [--kv_chunk none] [--max_new_tokens 256]
        [--median_len 48] [--step_rows 16] [--budget 2048] [--repeats 2] [--skip a,b,c]

(a) Length mix. `items` work items (random-id prompts of `prompt_len` tokens) are sampled at
temperature 1, item i with its own key fold_in(key(0), i), through `rows` rows, with a budget of
`max_new_tokens`. Target lengths are drawn from a log-normal distribution (median `median_len`,
log-σ 0.8, clipped to [4, max_new_tokens]; seed 0); a free run (the queue decoder, each item
capped at its target) and one of the static loop give each item's tokens, and per item the last
token it emits for the first time at or before its target in both runs, which no other item
emits before its own target, joins the stop set, so items end at or just before their targets
in both decoders (the realised lengths are printed; an item whose tokens differ between the runs
before its target, see below, ends at its last token before they differ). Two decoders
then decode the same items in the same run, each compiled ahead (compile time printed apart) and
timed over `repeats` alternating runs (best of each): the static loop (`generate` with
`kv_chunk=None, compactions=0` on items/rows batches of `rows` items, one key per row: every
step reads every slot of every row, and a batch runs until its longest item ends) and the queue
decoder (`es_jax.decode.queue`: a row whose item ends is refilled with the next waiting item,
`refill_rows` prompts prefilled at a time; once none waits, `compactions` halvings of the batch;
KV cache read in chunks of `kv_chunk` slots, or every slot with 'none'). Both give an item the
same draws, hence the same tokens up to float rounding (the items whose tokens are identical are
counted). Prints generated tokens per second of each, their ratio, and the decode steps and
prefills each ran.

(b) Step cost against cache fill. One decode step (`forward` with one new token per row over a
cache of `budget` slots, layers unrolled as the CPU decode loop runs them, cache donated so it is
updated in place) at fills of 5%, 50% and 100% of the budget, with the bucketed cache read
(`ForwardMode(kv_chunk=128)`: the first 128 slots while they hold the filled ones, else all) and
the dense one: milliseconds per step (median of `repeats` + 2 steps after a compiling one), the
5% / 100% ratio, each step's compile seconds (compiled ahead), and bucketed / dense ratios.

(c) Compiled bytes accessed per step needs a TPU compiler (libtpu, the `tpu` extra): skipped with
a note when it is not installed. Beside it, the same compiler's count for two lone operations at
the step's row count and at one row, the instrument's own floor: one [rows, D] x [D, F] matmul
against its weight's bytes, and the embedding lookup of `step_rows` tokens against the table.

`--model smollm2` is the bundled SmolLM2-135M-Instruct (fp32); `smollm2-random` has its shapes
and random weights (the same work). Each line ends with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # as tpu_plan: planners share libtpu

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np

from es_jax.decode import sampling
from es_jax.decode.loop import decode
from es_jax.decode.queue import decode_queue
from es_jax.es.member_axes import Member
from es_jax.models import (
  ForwardMode,
  forward,
  init_cache,
  param_shapes,
  params,
  unstack_cache,
  unstack_layers,
)
from experiments.benchmarks._common import MODELS, load_model

FILLS = (0.05, 0.5, 1.0)
KV_CHUNK = 128  # the queue decoder's and (b)'s bucketed cache reads (generate's kv_chunk=)
STATIC = dict(kv_chunk=None, compactions=0)  # every step reads all slots of all rows


def _load() -> str:
  return f"load {os.getloadavg()[0]:.1f}"


def stop_tokens(runs: list[np.ndarray], targets: np.ndarray) -> tuple[int, ...]:
  """Per item, the latest token it first emits at or before its target length in every run
  (`runs`: [W, T] tokens of each decoder's free run) that no other item emits, in any run, before
  its own target: the stop set that ends items at (or just before) their targets in every run."""
  firsts = []  # per run, per item: token -> first position
  for tokens in runs:
    firsts.append([{} for _ in tokens])
    for r, row in enumerate(tokens):
      for pos, tok in enumerate(row.tolist()):
        firsts[-1][r].setdefault(tok, pos)
  chosen = set()
  for r, target in enumerate(targets):
    for pos in range(int(target) - 1, -1, -1):
      tok = int(runs[0][r, pos])
      own = all(
        int(t[r, pos]) == tok and f[r][tok] == pos for t, f in zip(runs, firsts, strict=True)
      )
      others = (i for i in range(len(targets)) if i != r)
      if own and all(f[i].get(tok, 1 << 30) >= targets[i] - 1 for i in others for f in firsts):
        chosen.add(tok)
        break
  return tuple(sorted(chosen))


def length_mix(p, cfg, args) -> None:
  rng = np.random.default_rng(0)
  W, B, T = args.items, args.rows, args.max_new_tokens
  ids = rng.integers(3, cfg.vocab_size, size=(W, args.prompt_len)).astype(np.int32)
  mask = np.ones_like(ids, bool)
  targets = np.clip(np.round(np.exp(rng.normal(np.log(args.median_len), 0.8, W))), 4, T).astype(int)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), jnp.arange(W))
  # Free runs of both decoders: an item's tokens can differ between them after a draw falls
  # within float rounding of a token boundary, so its stop token is taken before that point.
  queue_free = queue_call(p, cfg, ids, mask, keys, targets, (), args)[0]()[0]
  static_free = static_call(p, cfg, ids, mask, keys, (), args)[0]()
  eos = stop_tokens([np.asarray(run.tokens) for run in (static_free, queue_free)], targets)
  calls = {
    "static": static_call(p, cfg, ids, mask, keys, eos, args),
    "queue": queue_call(p, cfg, ids, mask, keys, np.full(W, T), eos, args),
  }
  best = {name: (float("inf"), None) for name in calls}
  for _ in range(args.repeats):  # alternate the loops, so load changes hit both alike
    for name, (call, _) in calls.items():
      start = time.perf_counter()
      out = jax.block_until_ready(call())
      best[name] = min(best[name], (time.perf_counter() - start, out), key=lambda x: x[0])
  static, (queue, steps, prefills) = best["static"][1], best["queue"][1]
  lengths = np.asarray(static.lengths)
  batch_max = lengths[: W // B * B].reshape(-1, B).max(axis=1)
  print(
    f"(a) length mix: {W} items through {B} rows, budget {T}, targets log-normal median "
    f"{args.median_len} (mean {targets.mean():.1f}, max {targets.max()}): realised lengths mean "
    f"{lengths.mean():.1f}, median {np.median(lengths):.0f}, "
    f"p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}; {lengths.sum()} tokens, "
    f"{len(eos)} stop tokens"
  )
  figures = {
    "static": (static, f"{int((batch_max - 1).sum())} steps, {len(batch_max)} prefills of {B}"),
    "queue": (queue, f"{int(steps)} steps, {int(prefills)} prefills of {args.refill_rows}"),
  }
  for name, (out, work) in figures.items():
    seconds, compile_s = best[name][0], calls[name][1]
    n = int(np.asarray(out.lengths).sum())
    speedup = (n / seconds) / (lengths.sum() / best["static"][0])
    same = (np.asarray(out.tokens) == np.asarray(static.tokens)).all(axis=1)
    print(
      f"    {name:<6} {n / seconds:6.1f} tok/s ({seconds:.2f} s, compile {compile_s:.1f} s, "
      f"{work}), x{speedup:.2f} the static loop's tok/s, items identical to static "
      f"{same.sum()}/{len(same)}, {_load()}"
    )


def _compiled(fn, *args, **static):
  """(`fn` compiled ahead for these arguments, seconds spent compiling)."""
  start = time.perf_counter()
  exe = fn.lower(*args, **static).compile()
  return exe, time.perf_counter() - start


def _decoding(eos, max_new_tokens, **layout) -> sampling.Decoding:
  """The decode settings: temperature 1, no nucleus, pad 0, laid out by `layout`, as the
  decode loops take them (`sampling.resolved`)."""
  decoding = sampling.Decoding(max_new_tokens, 1.0, None, eos, 0, **layout)
  return sampling.resolved(decoding, "decode_cost")


def queue_call(p, cfg, ids, mask, keys, budgets, eos, args):
  """The queue decoder on all items, each capped at `budgets`: (a zero-argument call returning
  (Completions, decode steps, prefills), compile seconds)."""
  decoding = _decoding(
    eos, args.max_new_tokens, kv_chunk=args.kv_chunk, compactions=args.compactions,
    refill_rows=args.refill_rows,
  )  # fmt: skip
  inputs = (p, ids, mask, keys, jnp.asarray(budgets, jnp.int32), decoding)
  exe, compile_s = _compiled(decode_queue, *inputs, config=cfg, rows=args.rows)
  return lambda: exe(*inputs), compile_s


def static_call(p, cfg, ids, mask, keys, eos, args):
  """The static loop on the items in turn, `rows` at a time: (a zero-argument call returning
  the Completions of all items, compile seconds)."""
  decoding = _decoding(eos, args.max_new_tokens, **STATIC)
  W, B = len(ids), args.rows
  batches = [(ids[i : i + B], mask[i : i + B], keys[i : i + B]) for i in range(0, W, B)]
  weights = Member(p)
  exe, compile_s = _compiled(decode, weights, *batches[0], decoding, config=cfg, row_groups=1)

  def run():
    outs = [exe(weights, *batch, decoding) for batch in batches]
    return jax.tree.map(lambda *x: jnp.concatenate(x), *outs)

  return run, compile_s


def step_cost(p, cfg, args) -> None:
  layers = unstack_layers(p)
  B, T = args.step_rows, args.budget
  tok = jnp.full((B, 1), 7, jnp.int32)
  live = jnp.ones((B, 1), bool)

  def step(params, cache, index, kv_chunk):
    logits, cache = forward(
      params, tok, jnp.full((B, 1), index), config=cfg, mask=live,
      mode=ForwardMode(cache, index, kv_chunk),
    )  # fmt: skip
    return logits, cache

  times, compile_s = {}, {}
  cache = unstack_cache(init_cache(cfg, B, T))
  runs = {}
  for name, chunk in (("bucketed", KV_CHUNK), ("dense", None)):
    fn = jax.jit(
      lambda params, cache, index, chunk=chunk: step(params, cache, index, chunk), donate_argnums=1
    )  # fmt: skip
    runs[name], compile_s[name] = _compiled(fn, layers, cache, jnp.int32(0))
  del cache
  for fill in FILLS:
    index = min(int(fill * T), T - 1)
    for name, run in runs.items():  # both reads at one fill, back to back
      cache = init_cache(cfg, B, T)
      cache = unstack_cache(cache._replace(mask=jnp.arange(T)[None, :].repeat(B, 0) < index))
      samples = []
      for _ in range(args.repeats + 3):
        start = time.perf_counter()
        logits, cache = run(layers, cache, jnp.int32(index))
        jax.block_until_ready(logits)
        samples.append(time.perf_counter() - start)
      times[name, fill] = float(np.median(samples[1:]))
      del cache
  for name in ("bucketed", "dense"):
    ms = ", ".join(f"{int(f * 100)}% {1e3 * times[name, f]:.1f} ms" for f in FILLS)
    ratio = times[name, FILLS[0]] / times[name, FILLS[-1]]
    print(
      f"(b) one step, {B} rows, {T}-slot cache, {name}: {ms}; 5%/100% = {ratio:.2f}; "
      f"compile {compile_s[name]:.1f} s, {_load()}"
    )
  ratios = ", ".join(
    f"{int(f * 100)}% {times['bucketed', f] / times['dense', f]:.2f}" for f in FILLS
  )
  print(
    f"(b) bucketed / dense: step {ratios}; compile {compile_s['bucketed'] / compile_s['dense']:.2f}"
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2", choices=MODELS)
  parser.add_argument("--items", type=int, default=64, help="(a): W work items")
  parser.add_argument("--rows", type=int, default=16, help="(a): B rows decoded at once")
  parser.add_argument("--refill_rows", type=int, default=4, help="(a): R prompts per prefill")
  parser.add_argument(
    "--compactions", type=int, default=2, help="(a): the queue's halvings once no item waits"
  )
  parser.add_argument(
    "--kv_chunk", type=lambda x: None if x == "none" else int(x), default=None,
    help="(a): the queue decoder's cache chunk ('none': it reads every slot, as the static loop)",
  )  # fmt: skip
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--max_new_tokens", type=int, default=256)
  parser.add_argument("--median_len", type=int, default=48)
  parser.add_argument("--step_rows", type=int, default=16)
  parser.add_argument("--budget", type=int, default=2048)
  parser.add_argument("--repeats", type=int, default=2, help="timed runs (after compiling)")
  parser.add_argument("--topology", default="v5e:2x2", help="TPU topology for (c) (one chip)")
  parser.add_argument("--skip", default="", help="comma list of parts to skip: a,b,c")
  args = parser.parse_args(argv)
  if args.items % args.rows:
    parser.error(f"--items={args.items} must be a multiple of --rows={args.rows}.")
  model, _ = load_model(args.model)
  p, cfg = params(model), model.config
  print(f"model {args.model}, {cfg.dtype}, jax {jax.__version__} on {jax.devices()[0].platform}")
  if "a" not in args.skip:
    length_mix(p, cfg, args)
  if "b" not in args.skip:
    step_cost(p, cfg, args)
  if "c" in args.skip:
    return
  if importlib.util.find_spec("libtpu") is None:
    print("(c) compiled bytes per step: skipped, libtpu is not installed (the `tpu` extra).")
  else:
    tpu_bytes(cfg, args)


def tpu_bytes(cfg, args) -> None:
  """Compiled bytes accessed by one decode step for a TPU chip (deviceless compile), against
  the weights' bytes plus the filled KV slots' bytes, at each fill."""
  from experiments.tpu import programs as tpu_programs

  mesh = tpu_programs.make_mesh(tpu_programs.topology_devices(args.topology), 1, 1)
  B, T, c = args.step_rows, args.budget, cfg
  zeros = lambda s: jnp.zeros(s, cfg.jnp_dtype)  # noqa: E731
  is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
  shapes = jax.eval_shape(
    lambda: unstack_layers(jax.tree.map(zeros, param_shapes(cfg), is_leaf=is_shape))
  )
  layers = jax.tree.map(lambda x: tpu_programs._sds(x.shape, cfg.jnp_dtype, mesh), shapes)
  weight_bytes = sum(x.size * cfg.jnp_dtype.itemsize for x in jax.tree.leaves(layers))
  cache = jax.tree.map(
    lambda x: tpu_programs._sds(x.shape, x.dtype, mesh),
    jax.eval_shape(lambda: unstack_cache(init_cache(cfg, B, T))),
  )
  slot_bytes = 2 * c.num_layers * B * c.num_kv_heads * c.head_dim * cfg.jnp_dtype.itemsize
  for name, chunk in (("bucketed", KV_CHUNK), ("dense", None)):
    ratios = []
    for fill in FILLS:
      index = min(int(fill * T), T - 1)  # static: the program reads the chunks up to it

      def step(params, cache, index=index, chunk=chunk):
        tok, pos = jnp.zeros((B, 1), jnp.int32), jnp.full((B, 1), index)
        return forward(params, tok, pos, config=cfg, mode=ForwardMode(cache, index, chunk))

      compiled = jax.jit(step, donate_argnums=1).lower(layers, cache).compile()
      accessed = tpu_programs.figures(compiled)["bytes_accessed"]
      ideal = weight_bytes + slot_bytes * (index + 1)
      ratios.append(f"{int(fill * 100)}% {accessed / 2**20:.0f} MiB = {accessed / ideal:.2f}x")
    print(
      f"(c) one step, one chip of {args.topology} (deviceless compile), {B} rows, {T} slots, "
      f"{name}: "
      f"bytes accessed vs weights {weight_bytes / 2**20:.0f} MiB + filled KV: {'; '.join(ratios)}"
    )
  _instrument_floor(cfg, mesh, B)


def _instrument_floor(cfg, mesh, rows: int) -> None:
  """(c)'s compiler counting lone operations: a matmul at `rows` and 1 row against its weight's
  bytes, and a lookup of `rows` tokens against the embedding table's."""
  from experiments.tpu import programs as tpu_programs

  sds = lambda s, dtype=cfg.jnp_dtype: tpu_programs._sds(s, dtype, mesh)  # noqa: E731
  counted = lambda fn, *a: tpu_programs.figures(jax.jit(fn).lower(*a).compile())["bytes_accessed"]  # noqa: E731
  D, F, V, size = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.jnp_dtype.itemsize
  ratios = [counted(jnp.matmul, sds((b, D)), sds((D, F))) / (D * F * size) for b in (rows, 1)]
  lookup = counted(lambda e, t: e[t], sds((V, D)), sds((rows,), jnp.int32)) / (V * D * size)
  print(
    f"(c) the compiler's count for lone operations: one [{rows}, {D}] x [{D}, {F}] matmul "
    f"{ratios[0]:.2f}x its weight's bytes ({ratios[1]:.2f}x at 1 row); a lookup of {rows} "
    f"tokens {lookup:.2f}x the whole [{V}, {D}] table"
  )


if __name__ == "__main__":
  main()
