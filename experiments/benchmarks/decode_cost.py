"""Decode cost against the tokens generated: the chunked, compacting decode loop vs the static one.

    python -m experiments.benchmarks.decode_cost [--model smollm2] [--rows 16]
        [--max_new_tokens 256] [--step_rows 16] [--budget 2048] [--repeats 2]

(a) Length mix. `rows` random-id prompts of `prompt_len` tokens are sampled (temperature 1 and a
fixed key: varied text, where greedy decoding of random prompts loops) with a budget of
`max_new_tokens`. Target lengths are drawn from a log-normal distribution (median `median_len`,
log-σ 0.8, clipped to [4, max_new_tokens]; seed 0); a free run of the static loop picks, per row, a
token it emits near its target and never earlier, and those tokens become the stop set, so rows end
near their targets (the realised lengths are printed: another row's stop token can end a row
earlier, and a row without a suitable token runs to the budget). Two loops decode the same rows in
the same run, each compiled ahead (compile time printed apart) and timed over `repeats` alternating
runs (best of each): the static loop (`kv_chunk=None, compactions=0`: every step reads every slot
of every row until the longest row ends, `generate`'s default) and the cost-following loop
(`KV_CHUNK` chunked cache reads, `COMPACTIONS` halvings of the batch as rows end). Prints
generated tokens per second of each, the ratio, and how many rows' tokens equal the static
loop's (a sampled row can diverge where a draw falls within float rounding of a token boundary:
`es_jax.decode_loop`).

(b) Step cost against cache fill. One decode step (`forward` with one new token per row over a
cache of `budget` slots, layers unrolled as the CPU decode loop runs them, cache donated so it is
updated in place) at fills of 5%, 50% and 100% of the budget, with the chunked and the dense
cache reads: milliseconds per step (median of `repeats` + 2 steps after a compiling one) and
the 5% / 100% ratio.

(c) Compiled bytes accessed per step needs a TPU compiler (libtpu, the `tpu` extra): skipped with
a note when it is not installed.

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

from es_jax import sampling
from es_jax.decode_loop import decode
from es_jax.models import (
  forward,
  init_cache,
  param_shapes,
  params,
  unstack_cache,
  unstack_layers,
)
from experiments.benchmarks._common import MODELS, load_model

FILLS = (0.05, 0.5, 1.0)
KV_CHUNK, COMPACTIONS = 128, 2  # the cost-following loop (generate's kv_chunk=, compactions=)
STATIC = dict(kv_chunk=None, compactions=0)  # every step reads all slots of all rows
LOOPS = (
  ("static", STATIC),
  ("cost-following", dict(kv_chunk=KV_CHUNK, compactions=COMPACTIONS)),
)


def _load() -> str:
  return f"load {os.getloadavg()[0]:.1f}"


def stop_tokens(tokens: np.ndarray, targets: np.ndarray) -> tuple[int, ...]:
  """Per row, the latest token it first emits at or before its target length that no other row
  emits before its own target: the stop set that ends rows at (or near) their targets."""
  first = [{} for _ in tokens]  # per row: token -> first position
  for r, row in enumerate(tokens):
    for pos, tok in enumerate(row.tolist()):
      first[r].setdefault(tok, pos)
  chosen = set()
  for r, target in enumerate(targets):
    for pos in range(int(target) - 1, -1, -1):
      tok = int(tokens[r, pos])
      own = first[r][tok] == pos
      if own and all(first[i].get(tok, 1 << 30) >= targets[i] - 1 for i in range(len(tokens))):
        chosen.add(tok)
        break
  return tuple(sorted(chosen))


def length_mix(p, cfg, args) -> None:
  rng = np.random.default_rng(0)
  ids = rng.integers(3, cfg.vocab_size, size=(args.rows, args.prompt_len)).astype(np.int32)
  mask = np.ones_like(ids, bool)
  targets = np.clip(
    np.round(np.exp(rng.normal(np.log(args.median_len), 0.8, args.rows))), 4, args.max_new_tokens
  ).astype(int)
  key = jax.random.key(0)
  free = compiled(p, cfg, ids, mask, key, args.max_new_tokens, (), STATIC)[0]()
  eos = stop_tokens(np.asarray(free.tokens), targets)
  calls = {
    name: compiled(p, cfg, ids, mask, key, args.max_new_tokens, eos, loop) for name, loop in LOOPS
  }
  runs = {name: [float("inf"), calls[name][1], None] for name, _ in LOOPS}
  for _ in range(args.repeats):  # alternate the loops, so load changes hit both alike
    for name, _ in LOOPS:
      start = time.perf_counter()
      out = jax.block_until_ready(calls[name][0]())
      runs[name] = [min(runs[name][0], time.perf_counter() - start), calls[name][1], out]
  static = runs["static"][2]
  lengths = np.asarray(static.lengths)
  print(
    f"(a) length mix: {args.rows} rows, budget {args.max_new_tokens}, targets log-normal median "
    f"{args.median_len} (mean {targets.mean():.1f}, max {targets.max()}): realised lengths mean "
    f"{lengths.mean():.1f}, median {np.median(lengths):.0f}, "
    f"p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}; {lengths.sum()} tokens"
  )
  for name, loop in LOOPS:
    seconds, compile_s, out = runs[name]
    n = int(np.asarray(out.lengths).sum())
    speedup = (n / seconds) / (lengths.sum() / runs["static"][0])
    same = (np.asarray(out.tokens) == np.asarray(static.tokens)).all(axis=1)
    print(
      f"    {name:<10} {loop}: {n / seconds:6.1f} tok/s ({seconds:.2f} s, "
      f"compile {compile_s:.1f} s), x{speedup:.2f} the static loop's tok/s, rows identical "
      f"to static {same.sum()}/{len(same)}, {_load()}"
    )


def compiled(p, cfg, ids, mask, key, max_new_tokens, eos, loop):
  """(a zero-argument call of the compiled decode, seconds spent compiling it)."""
  opts = {
    **sampling._decode_options(max_new_tokens, 1.0, None, eos, 0, None),
    **sampling._loop_options(**loop),
  }
  dynamic = {k: opts.pop(k) for k in ("temperature", "top_p")}
  start = time.perf_counter()
  exe = decode.lower(p, None, None, ids, mask, key, config=cfg, **dynamic, **opts).compile()
  compile_s = time.perf_counter() - start
  return lambda: exe(p, None, None, ids, mask, key, **dynamic), compile_s


def step_cost(p, cfg, args) -> None:
  layers = unstack_layers(p)
  B, T = args.step_rows, args.budget
  tok = jnp.full((B, 1), 7, jnp.int32)
  live = jnp.ones((B, 1), bool)

  def step(params, cache, index, kv_chunk):
    logits, cache = forward(
      params, tok, jnp.full((B, 1), index), config=cfg, mask=live, cache=cache,
      cache_index=index, kv_chunk=kv_chunk,
    )  # fmt: skip
    return logits, cache

  times = {}
  runs = {
    name: jax.jit(
      lambda params, cache, index, chunk=chunk: step(params, cache, index, chunk), donate_argnums=1
    )  # fmt: skip
    for name, chunk in (("chunked", KV_CHUNK), ("dense", None))
  }
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
  for name in ("chunked", "dense"):
    ms = ", ".join(f"{int(f * 100)}% {1e3 * times[name, f]:.1f} ms" for f in FILLS)
    ratio = times[name, FILLS[0]] / times[name, FILLS[-1]]
    print(f"(b) one step, {B} rows, {T}-slot cache, {name}: {ms}; 5%/100% = {ratio:.2f}, {_load()}")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2", choices=MODELS)
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--max_new_tokens", type=int, default=256)
  parser.add_argument("--median_len", type=int, default=48)
  parser.add_argument("--step_rows", type=int, default=16)
  parser.add_argument("--budget", type=int, default=2048)
  parser.add_argument("--repeats", type=int, default=2, help="timed runs (after compiling)")
  parser.add_argument("--topology", default="v5e:2x2", help="TPU topology for (c) (one chip)")
  parser.add_argument("--skip", default="", help="comma list of parts to skip: a,b,c")
  args = parser.parse_args(argv)
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
  from experiments import tpu_programs

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
  for name, chunk in (("chunked", KV_CHUNK), ("dense", None)):
    ratios = []
    for fill in FILLS:
      index = min(int(fill * T), T - 1)  # static: the program reads the chunks up to it

      def step(params, cache, index=index, chunk=chunk):
        tok, pos = jnp.zeros((B, 1), jnp.int32), jnp.full((B, 1), index)
        return forward(params, tok, pos, config=cfg, cache=cache, cache_index=index, kv_chunk=chunk)

      compiled = jax.jit(step, donate_argnums=1).lower(layers, cache).compile()
      accessed = tpu_programs.figures(compiled)["bytes_accessed"]
      ideal = weight_bytes + slot_bytes * (index + 1)
      ratios.append(f"{int(fill * 100)}% {accessed / 2**20:.0f} MiB = {accessed / ideal:.2f}x")
    print(
      f"(c) one step, one chip of {args.topology} (deviceless compile), {B} rows, {T} slots, "
      f"{name}: "
      f"bytes accessed vs weights {weight_bytes / 2**20:.0f} MiB + filled KV: {'; '.join(ratios)}"
    )


if __name__ == "__main__":
  main()
