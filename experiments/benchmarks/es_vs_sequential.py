"""One ES step, batched (es_jax) against the reference code's perturb / generate / restore loop.

    python -m experiments.benchmarks.es_vs_sequential [--model tiny|smollm2] [--population 16]
        [--prompts 4] [--prompt_len 32] [--max_new_tokens 16] [--members_per_chunk 4]
        [--sigma 0.01] [--learning_rate 0.001] [--repeats 5] [--no-looped]
        [--prng threefry2x32|rbg|unsafe_rbg]

Both sides do the same work on the same model and prompts: N members x P prompts x T greedy new
tokens (EOS disabled, so every row generates exactly T tokens), a host score per member, z-score
shaping and the update ``θ ← θ + (α/N) Σ_i w_i ε_i`` with ``ε_i`` regenerated from the step key.

* batched (es_jax): ``population.evaluate_population(members_per_chunk=M)`` (one jitted program, M
  members vmapped per chunk) followed by one jitted ``optax.chain(es_gradient(spec), sgd(α))``
  update. With the default ``--looped`` the same step with ``M = 1`` is timed too, to separate what
  the vmap buys from what the single program buys.
* sequential (the reference code's scheme, ported as PyTorch's in-place ``add_`` would be): for each
  member ``i`` a jitted ``θ += σ ε_i`` (donated buffers, i.e. in place), ``sampling.generate`` on
  the P prompts, the host score, then a jitted ``θ -= σ ε_i``; the update regenerates every
  ``ε_i`` once more and adds ``(α/N) w_i ε_i`` member by member (jitted, in place). Each jitted
  function is compiled once (the member index is traced).

Greedy fitness must be identical on both sides (asserted); the updated parameters differ only by
rounding (the max difference is printed). Every timed step starts from a fresh copy of θ (copied
outside the timer). The first step of each side compiles and is not timed; then ``--repeats``
steps of each side run interleaved. Prints seconds per step (best and mean), a per-phase split,
tokens/s and the final ratio sequential / batched (the goal: >= 3).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from es_jax.decode import sampling
from es_jax.es import fitness as fitness_lib
from es_jax.es import gradient as es
from es_jax.es import members, noise, population
from es_jax.models import params as model_params
from experiments.benchmarks._common import load_model, workload_parser


def load_params(name: str):
  """(params, config) of ``--model`` (``_common.load_model``)."""
  model, _ = load_model(name)
  return model_params(model), model.config


def score(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Host reward per prompt, [P]: the mean of ``token mod 7`` over generated tokens, in [0, 1].

  Cheap (the verifier's cost is not part of this benchmark) and sensitive to every token, so
  members that generate differently get different fitness.
  """
  return ((tokens % 7) * mask).sum(axis=-1) / (6.0 * np.maximum(mask.sum(axis=-1), 1))


# The reference code's primitives, each jitted on its own, with θ donated (the port of an in-place
# `param.data.add_(...)`), and the member index traced so each compiles once. One member key at a
# time: the reference loops over members itself (full rank, not antithetic).
_SPEC = noise.NoiseSpec(1)


@functools.partial(jax.jit, donate_argnums=(0,))
def _perturb(params, step_key, i, sigma):
  """θ += σ ε_i."""
  return members.perturb_member(params, step_key, i, sigma, _SPEC)


@functools.partial(jax.jit, donate_argnums=(0,))
def _restore(params, step_key, i, sigma):
  """θ -= σ ε_i (the same noise, regenerated from the key)."""
  return members.perturb_member(params, step_key, i, -sigma, _SPEC)


@functools.partial(jax.jit, donate_argnums=(0,))
def _add_member(params, step_key, i, scale):
  """θ += scale ε_i, with scale = α w_i / N: one member's share of the update."""
  return members.perturb_member(params, step_key, i, scale, _SPEC)


@functools.partial(jax.jit, static_argnames=("population_size",))
def _zscore(fitness, *, population_size):
  return fitness_lib.shape_fitness(fitness, population_size=population_size, shaping="zscore")


def _sync(tree):
  return jax.block_until_ready(tree)


def sequential_step(params, ids, mask, *, config, step_key, sigma, lr, n, max_new_tokens, phases):
  """The reference code's ES step on ``params`` (consumed); returns (new params, fitness [N]).

  ``phases`` accumulates seconds per phase (each phase is synchronised, as eager PyTorch is).
  """
  sigma = jnp.float32(sigma)
  rewards = np.zeros((n, ids.shape[0]), np.float32)
  for i in range(n):
    idx = jnp.int32(i)
    t0 = time.perf_counter()
    params = _sync(_perturb(params, step_key, idx, sigma))
    t1 = time.perf_counter()
    out = sampling.generate(
      params, ids, mask, sampling.Decoding(max_new_tokens), key=step_key, config=config
    )
    rewards[i] = score(np.asarray(out.tokens), np.asarray(out.mask))
    t2 = time.perf_counter()
    params = _sync(_restore(params, step_key, idx, sigma))
    t3 = time.perf_counter()
    phases["perturb"] += t1 - t0
    phases["generate + score"] += t2 - t1
    phases["restore"] += t3 - t2
  fitness = rewards.mean(axis=1).astype(np.float32)  # as population.evaluate_population forms it
  t0 = time.perf_counter()
  w = np.asarray(_zscore(fitness, population_size=n))
  for i in range(n):
    params = _add_member(params, step_key, jnp.int32(i), jnp.float32(lr * w[i] / n))
  params = _sync(params)
  phases["update"] += time.perf_counter() - t0
  return params, fitness


def _parse(argv) -> argparse.Namespace:
  parser = workload_parser(__doc__)
  parser.add_argument("--population", type=int, default=16, help="N: population size")
  parser.add_argument(
    "--members_per_chunk", type=int, default=4, help="M: members vmapped per chunk (batched side)"
  )
  parser.add_argument("--sigma", type=float, default=0.01, help="σ")
  parser.add_argument("--repeats", type=int, default=5, help="timed steps per side")
  parser.add_argument(
    "--looped",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also time the batched step with M = 1",
  )
  return parser.parse_args(argv)


def _sides(args, config, ids, mask, step_key) -> dict:
  """{side name: fn(params, phases) -> (new params, fitness)}: batched with M (and M = 1 with
  --looped), then the sequential seed scheme."""
  N, T, M = args.population, args.max_new_tokens, args.members_per_chunk
  spec = noise.NoiseSpec(N)  # the evaluation's and the update's
  optimizer = optax.chain(es.es_gradient(spec), optax.sgd(args.learning_rate))

  @functools.partial(jax.jit, donate_argnums=(0,))
  def apply_update(params, opt_state, fitness, key):
    updates, opt_state = optimizer.update(params, opt_state, params, fitness=fitness, key=key)
    return optax.apply_updates(params, updates), opt_state

  def batched_step(params, members_per_chunk, phases):
    t0 = time.perf_counter()
    fitness, _ = population.evaluate_population(
      params,
      ids,
      mask,
      settings=population.PopulationSettings(spec, args.sigma, config, members_per_chunk),
      decoding=sampling.Decoding(T),  # greedy
      step_key=step_key,
      score_fn=score,
    )
    t1 = time.perf_counter()
    params, _ = _sync(apply_update(params, optimizer.init(params), fitness, step_key))
    phases["evaluate (generate + score)"] += t1 - t0
    phases["update"] += time.perf_counter() - t1
    return params, fitness

  def run_sequential(params, phases):
    return sequential_step(
      params,
      ids,
      mask,
      config=config,
      step_key=step_key,
      sigma=args.sigma,
      lr=args.learning_rate,
      n=N,
      max_new_tokens=T,
      phases=phases,
    )

  sides = {f"batched (M={M})": functools.partial(batched_step, members_per_chunk=M)}
  if args.looped and M != 1:
    sides["batched (M=1)"] = functools.partial(batched_step, members_per_chunk=1)
  sides["sequential (seed scheme)"] = run_sequential
  return sides


def _time_sides(sides: dict, params0, repeats: int):
  """(first-step seconds, timed seconds, last (params, fitness), phase seconds) per side; each
  step from a fresh copy of `params0`, the sides interleaved."""

  def fresh():
    return _sync(jax.tree.map(jnp.copy, params0))

  first, times, results = {}, {k: [] for k in sides}, {}
  phases = {k: collections.defaultdict(float) for k in sides}  # summed over the timed steps
  for name, fn in sides.items():  # the first step compiles: not timed
    t0 = time.perf_counter()
    results[name] = fn(fresh(), phases=collections.defaultdict(float))
    first[name] = time.perf_counter() - t0
  for _ in range(repeats):  # interleaved, so background load skews every side alike
    for name, fn in sides.items():
      params = fresh()
      t0 = time.perf_counter()
      new_params, fitness = fn(params, phases=phases[name])
      times[name].append(time.perf_counter() - t0)
      if not np.array_equal(fitness, results[name][1]):
        raise AssertionError(f"{name}: fitness changed between repeats")
      results[name] = (new_params, fitness)
  return first, times, results, phases


def _check_agreement(results: dict, batched: str, params0) -> dict[str, float]:
  """Asserts equal greedy fitness on every side; prints it and returns each side's max |Δθ|
  from the batched side's update (the same up to rounding)."""
  ref_params, ref_fitness = results[batched]
  for name, (_, fitness) in results.items():
    if not np.array_equal(fitness, ref_fitness):
      diff = np.flatnonzero(fitness != ref_fitness)
      raise AssertionError(
        f"fitness differs between {batched} and {name} at members {diff.tolist()}: "
        f"{ref_fitness[diff]} vs {fitness[diff]}"
      )
  deltas = {
    name: max(
      float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
      for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(ref_params), strict=True)
    )
    for name, (p, _) in results.items()
  }
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(params0), strict=True)
  )
  print(
    f"fitness equal on every side ({len(np.unique(ref_fitness))} distinct values over "
    f"{ref_fitness.size} members, mean {ref_fitness.mean():.4f}); update moved θ by up to "
    f"{moved:.3g}"
  )
  return deltas


def main(argv=None):
  args = _parse(argv)
  N, P, S, T, M = (
    args.population,
    args.prompts,
    args.prompt_len,
    args.max_new_tokens,
    args.members_per_chunk,
  )
  t0 = time.perf_counter()
  params0, config = load_params(args.model)
  n_params = sum(x.size for x in jax.tree.leaves(params0))
  print(
    f"model {args.model} ({n_params / 1e6:.2f}M params) ready in {time.perf_counter() - t0:.1f}s; "
    f"{jax.device_count()} x {jax.devices()[0].platform}; N={N} members x P={P} prompts x T={T} "
    f"tokens (prompt length {S}), M={M}, sigma={args.sigma}, {args.prng} keys, "
    f"jax {jax.__version__}; load average {os.getloadavg()[0]:.1f} (other processes skew timings)"
  )
  rng = np.random.RandomState(0)
  ids = rng.randint(0, min(config.vocab_size, 10_000), (P, S)).astype(np.int32)
  mask = np.ones((P, S), bool)
  step_key = jax.random.key(1, impl=args.prng)
  sides = _sides(args, config, ids, mask, step_key)
  batched, seq = f"batched (M={M})", "sequential (seed scheme)"
  first, times, results, phases = _time_sides(sides, params0, args.repeats)
  deltas = _check_agreement(results, batched, params0)

  work = N * P * T
  print(f"\n{'ES step':<28} {'first':>8} {'best':>8} {'mean':>8} {'tok/s':>8}  max |Δθ| vs batched")
  for name in sides:
    b, m = min(times[name]), float(np.mean(times[name]))
    print(f"{name:<28} {first[name]:7.2f}s {b:7.3f}s {m:7.3f}s {work / b:8.1f}  {deltas[name]:.3g}")
  print("\nper-phase seconds per step (mean of the timed steps):")
  for name in sides:
    split = ", ".join(f"{k} {v / args.repeats:.3f}" for k, v in phases[name].items())
    print(f"  {name:<28} {split}")
  if "batched (M=1)" in sides:
    looped = min(times["batched (M=1)"])
    print(f"\nbatched M=1 / M={M} (what the vmap buys): {looped / min(times[batched]):.2f}x")
    print(
      f"sequential / batched M=1 (one program; 2 noise draws per member, not 3): "
      f"{min(times[seq]) / looped:.2f}x"
    )
  ratio = min(times[seq]) / min(times[batched])
  print(
    f"\nratio sequential / batched (M={M}), best step time: {ratio:.2f}x "
    f"(goal >= 3x: {'met' if ratio >= 3 else 'missed'})"
  )


if __name__ == "__main__":
  main()
