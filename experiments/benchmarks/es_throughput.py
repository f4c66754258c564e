"""ES population evaluation throughput against plain batched inference (measured in one run).

    python -m experiments.benchmarks.es_throughput [--model default|tiny-llama|smollm2-135m|...]
        [--population 4] [--prompts 4] [--prompt_len 32] [--max_new_tokens 16]
        [--members_per_chunk 4] [--rank 4] [--repeats 2] [--mesh] [--skip_prng]

One population evaluation is N members x P prompts x T new tokens (EOS disabled, so every row
generates exactly T tokens and the work is equal). Timed, each after a compile call:

* inference: the unperturbed model generates the same N x P sequences in one batch: the
  reference point ("fraction of inference throughput", EGGROLL's measure).
* full rank, looped: ``population.evaluate_population(members_per_chunk=1)``, one member at a time.
* full rank, vmapped: ``members_per_chunk=M`` members per chunk.
* low rank (EGGROLL, ``rank=r``), vmapped: all members of a chunk share the base matmuls.
* noise: drawing one member's full-rank noise and perturbing θ (``members.perturb_member``) with
  the default threefry PRNG vs ``rbg`` and ``unsafe_rbg`` keys (measured: noise can dominate a
  CPU ES step), plus full rank looped with an ``rbg`` step key end to end.

Prints generated tokens/s of each and its ratio to inference, plus the looped/vmapped and
low/full ratios. ``--model default`` is SmolLM2-135M-Instruct (the bundled GGUF); a preset name
builds that architecture with random weights. Scoring is a trivial host function (the verifier's
cost is not part of this benchmark).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np
from flax import nnx

from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.es import members, noise, population
from es_jax.models import Transformer, get_config, load_default
from es_jax.models import params as model_params


def _time_round_robin(cases: dict, repeats: int) -> dict[str, tuple[float, float]]:
  """{name: (first call seconds incl. compile, best of `repeats`)}.

  The timed calls are interleaved (one of each case per round), so load from other processes on a
  shared machine skews every case alike rather than whichever ran at a busy moment.
  """
  first, best = {}, {name: float("inf") for name in cases}
  for name, fn in cases.items():
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first[name] = time.perf_counter() - t0
  for _ in range(repeats):
    for name, fn in cases.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      best[name] = min(best[name], time.perf_counter() - t0)
  return {name: (first[name], best[name]) for name in cases}


def _score(tokens, mask):
  return mask.mean(axis=-1)


def _parse(argv) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="default")
  parser.add_argument("--population", type=int, default=4)
  parser.add_argument("--prompts", type=int, default=4)
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--max_new_tokens", type=int, default=16)
  parser.add_argument("--members_per_chunk", type=int, default=4)
  parser.add_argument("--rank", type=int, default=4)
  parser.add_argument("--sigma", type=float, default=1e-3)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--mesh", action="store_true", help="split members over all devices")
  parser.add_argument("--skip_prng", action="store_true", help="skip the rbg/unsafe_rbg runs")
  return parser.parse_args(argv)


def _load(args: argparse.Namespace):
  """(params, model config, mesh or None) of `args.model`, with the run's settings printed."""
  N, P, S, T = args.population, args.prompts, args.prompt_len, args.max_new_tokens
  t0 = time.perf_counter()
  if args.model == "default":
    model, _ = load_default()
  else:
    model = Transformer(get_config(args.model), rngs=nnx.Rngs(0))
  config = model.config
  params = model_params(model)
  del model
  print(
    f"model {args.model} ({config.num_params() / 1e6:.1f}M params) ready in "
    f"{time.perf_counter() - t0:.1f}s; {jax.device_count()} x {jax.devices()[0].platform}; "
    f"N={N} members x P={P} prompts x T={T} tokens (prompt length {S}), "
    f"M={args.members_per_chunk}, rank={args.rank}, jax {jax.__version__}; "
    f"load average {os.getloadavg()[0]:.1f} (other processes skew the ratios)"
  )
  mesh = sharding.make_mesh() if args.mesh else None
  if mesh is not None:
    params = sharding.shard_params(params, mesh)
  return params, config, mesh


def _evaluation_times(args, params, config, mesh, ids, mask, step_key) -> dict[str, float]:
  """Times the population evaluations against inference, prints them and their ratios; returns
  {case: best seconds}."""
  N, P, T = args.population, args.prompts, args.max_new_tokens
  work = N * P * T  # generated tokens per evaluation (EOS disabled)
  M, r = args.members_per_chunk, args.rank

  def evaluate(members_per_chunk, rank=None, key=step_key):
    return lambda: population.evaluate_population(
      params,
      ids,
      mask,
      settings=population.PopulationSettings(
        noise.NoiseSpec(N, rank=rank), args.sigma, config, members_per_chunk, mesh
      ),
      decoding=sampling.Decoding(T),  # greedy
      step_key=key,
      score_fn=_score,
    )[0]

  def infer(batch_ids, batch_mask):
    return sampling.generate(
      params, batch_ids, batch_mask, sampling.Decoding(T), key=step_key, config=config
    )

  batch_ids, batch_mask = np.tile(ids, (N, 1)), np.tile(mask, (N, 1))
  base = f"inference, one batch of {N * P}"
  full_loop, full_vmap = "full rank, looped (M=1)", f"full rank, vmapped (M={M})"
  low_loop, low_vmap = f"low rank r={r}, looped (M=1)", f"low rank r={r}, vmapped (M={M})"
  full_rbg = "full rank, looped (M=1), rbg key"
  cases = {
    base: lambda: infer(batch_ids, batch_mask).tokens,
    f"inference, {N} batches of {P} (looped)": lambda: [infer(ids, mask).tokens for _ in range(N)],
    full_loop: evaluate(1),
    full_vmap: evaluate(M),
    low_loop: evaluate(1, r),
    low_vmap: evaluate(M, r),
  }
  if not args.skip_prng:
    cases[full_rbg] = evaluate(1, key=jax.random.key(1, impl="rbg"))
  times = _time_round_robin(cases, args.repeats)
  best = {name: b for name, (_, b) in times.items()}
  print(f"\n{'population evaluation':<40} {'first':>8} {'best':>8} {'tok/s':>8}  vs inference")
  for name, (first, b) in times.items():
    print(f"{name:<40} {first:7.2f}s {b:7.3f}s {work / b:8.1f}  {best[base] / b:6.3f}x")

  print("\nratios (same run; > 1 means the second is faster):")
  print(f"  full rank: looped / vmapped (M={M}):  {best[full_loop] / best[full_vmap]:.3f}")
  print(f"  full rank / low rank, looped:        {best[full_loop] / best[low_loop]:.3f}")
  print(f"  full rank / low rank, vmapped:       {best[full_vmap] / best[low_vmap]:.3f}")
  if not args.skip_prng:
    print(f"  full rank looped: threefry / rbg:    {best[full_loop] / best[full_rbg]:.3f}")
  return best


def _noise_times(args, params, step_key, looped_seconds: float) -> None:
  """Times one member's noise (full rank per PRNG, low-rank factors) and prints it beside the
  looped full-rank evaluation's time per member."""
  r = args.rank
  full_spec, low_spec = noise.NoiseSpec(1), noise.NoiseSpec(1, rank=r)
  perturb = jax.jit(lambda p, k: members.perturb_member(p, k, 0, args.sigma, full_spec))
  low_rank = jax.jit(lambda p, k: noise.member_noise(p, k, 0, low_spec))
  impls = ["threefry2x32"] + ([] if args.skip_prng else ["rbg", "unsafe_rbg"])
  noise_keys = {impl: jax.random.key(2, impl=impl) for impl in impls}
  noise_cases = {
    f"full rank, {impl}": (lambda k=k: perturb(params, k)) for impl, k in noise_keys.items()
  }
  noise_cases[f"low rank r={r} factors, threefry2x32"] = lambda: low_rank(params, step_key)
  noise_times = _time_round_robin(noise_cases, args.repeats)
  ref = noise_times["full rank, threefry2x32"][1]
  print(f"\n{'noise of one member (perturb_member)':<40} {'first':>8} {'best':>8}  vs threefry")
  for name, (first, b) in noise_times.items():
    print(f"{name:<40} {first:7.2f}s {b:7.3f}s  {ref / b:7.2f}x")
  print(
    f"full-rank threefry noise / full-rank looped evaluation, per member: "
    f"{ref / (looped_seconds / args.population):.2f}"
  )


def main(argv=None):
  args = _parse(argv)
  params, config, mesh = _load(args)
  rng = np.random.RandomState(0)
  P, S = args.prompts, args.prompt_len
  ids = rng.randint(0, min(config.vocab_size, 10_000), (P, S)).astype(np.int32)
  mask = np.ones((P, S), bool)
  step_key = jax.random.key(1)
  best = _evaluation_times(args, params, config, mesh, ids, mask, step_key)
  _noise_times(args, params, step_key, best["full rank, looped (M=1)"])


if __name__ == "__main__":
  main()
