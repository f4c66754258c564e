"""Peak memory of one full ES step (population evaluation + update) at two population sizes.

    python -m experiments.benchmarks.es_memory [--model tiny|smollm2] [--small 8] [--large 32]
        [--prompts 4] [--prompt_len 32] [--max_new_tokens 16] [--members_per_chunk 4]
        [--sigma 0.001] [--prng threefry2x32|rbg|unsafe_rbg] [--no-xla]

The goal: the step's peak memory at N = 32 within 10% of N = 8 with the same
members_per_chunk M, model and prompts. Full-rank evaluation holds ``M`` perturbed copies of θ per
chunk and the update regenerates the noise member by member, so nothing should grow with ``N``
except the ``[N, P, T]`` completions.

Each N runs in a fresh subprocess (``--_child N``, same flags), so allocator caches, compiled
programs and the other N's buffers cannot leak into the figure. The child loads the model, then
runs the step ``population.evaluate_population(members_per_chunk=M)`` followed by the jitted,
donated ``optax.chain(es_gradient(spec), sgd(α))`` update, twice, reading the kernel's peak
resident set (``VmHWM`` in ``/proc/self/status``; ``ru_maxrss`` where that is missing) around
each:

* load: the peak while importing JAX and loading the model (before any step).
* first step: the peak during the first step, compiles included (the high-water mark is reset by
  writing 5 to ``/proc/self/clear_refs`` after loading; without that reset it equals the process
  peak).
* step: the peak during the second, already compiled step (reset again first), and how far it
  rises above the resident set just before the step ("step growth"): the step's own buffers.

It also reports XLA's compiled memory analysis (``jit(...).lower(...).compile().memory_analysis()``)
of the jitted evaluation program (``population.population_completions``) and of the update:
arguments, outputs and temporaries, the figures the XLA buffer assignment plans for. Prints the
figures of both N and the final ratio line N_large / N_small.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time

from experiments.benchmarks._common import load_model, workload_parser

_MARKER = "ES_MEMORY_CHILD_RESULT "
MiB = 2**20


def _status_kib(field: str) -> int | None:
  """A ``kB`` field of /proc/self/status (``VmHWM``, ``VmRSS``) in KiB, or None."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


def _peak_bytes() -> int:
  """Peak resident set of this process so far (since the last reset), in bytes."""
  hwm = _status_kib("VmHWM")
  if hwm is not None:
    return hwm * 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _rss_bytes() -> int:
  rss = _status_kib("VmRSS")
  return -1 if rss is None else rss * 1024


def _reset_peak() -> bool:
  """Resets the kernel's peak-RSS mark (Linux >= 4.0); False where that is not possible."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def _analysis(compiled) -> dict[str, int] | None:
  """XLA's memory analysis of a compiled program as plain ints, or None if unsupported."""
  try:
    ma = compiled.memory_analysis()
  except Exception:  # not every backend implements it
    return None
  if ma is None:
    return None
  names = ("argument", "output", "alias", "temp", "generated_code")
  out = {n: int(getattr(ma, f"{n}_size_in_bytes", 0) or 0) for n in names}
  # Live at once at worst: inputs + outputs + scratch, minus outputs aliasing (donated) inputs.
  out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  return out


def child(args) -> dict:
  """Measures one N in this process; returns the figures as a JSON-able dict."""
  import jax
  import numpy as np
  import optax

  from es_jax.decode import sampling
  from es_jax.es import gradient as es
  from es_jax.es import noise, population
  from es_jax.models import params as model_params

  n, M = args._child, args.members_per_chunk
  P, S, T = args.prompts, args.prompt_len, args.max_new_tokens
  model, _ = load_model(args.model)
  config, params = model.config, model_params(model)
  del model
  rng = np.random.RandomState(0)
  ids = rng.randint(0, min(config.vocab_size, 10_000), (P, S)).astype(np.int32)
  mask = np.ones((P, S), bool)
  step_key = jax.random.key(1, impl=args.prng)

  def score(tokens, mask):
    return ((tokens % 7) * mask).sum(axis=-1) / (6.0 * np.maximum(mask.sum(axis=-1), 1))

  spec = noise.NoiseSpec(n)  # the evaluation's and the update's
  optimizer = optax.chain(es.es_gradient(spec), optax.sgd(args.learning_rate))

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def apply_update(params, opt_state, fitness, key):
    updates, opt_state = optimizer.update(params, opt_state, params, fitness=fitness, key=key)
    return optax.apply_updates(params, updates), opt_state

  eval_kw = dict(
    settings=population.PopulationSettings(spec, args.sigma, config, M),
    decoding=sampling.Decoding(T),  # greedy
    step_key=step_key,
    score_fn=score,
  )
  state = {"params": params, "opt_state": optimizer.init(params)}
  del params

  def step():
    t0 = time.perf_counter()
    fitness, _ = population.evaluate_population(state["params"], ids, mask, **eval_kw)
    state["params"], state["opt_state"] = jax.block_until_ready(
      apply_update(state["params"], state["opt_state"], fitness, step_key)
    )
    return time.perf_counter() - t0, fitness

  out = {"n": n, "load_peak": _peak_bytes(), "param_bytes": 0}
  out["param_bytes"] = sum(x.nbytes for x in jax.tree.leaves(state["params"]))
  out["peak_reset"] = _reset_peak()
  out["first_seconds"], _ = step()
  out["first_peak"] = _peak_bytes()
  _reset_peak()
  out["rss_before"] = _rss_bytes()
  out["step_seconds"], fitness = step()
  out["step_peak"] = _peak_bytes()
  out["fitness_mean"] = float(np.mean(fitness))
  out["process_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

  if not args.xla:
    out["xla_evaluate"] = out["xla_update"] = None
    return out
  out.update(_xla_figures(state, ids, mask, eval_kw, apply_update, fitness))
  return out


def _xla_figures(state, ids, mask, eval_kw, apply_update, fitness) -> dict:
  """XLA's plan for the step's two programs, lowered with the arguments evaluate passes."""
  import jax

  from es_jax.es import population

  key, settings = eval_kw["step_key"], eval_kw["settings"]
  lowered = population.population_completions.lower(
    state["params"],
    ids,
    mask,
    key,
    key,
    eval_kw["decoding"].as_float32(),
    jax.tree.map(jax.numpy.float32, settings),  # σ traced, as evaluate_population passes it
  )
  update = apply_update.lower(state["params"], state["opt_state"], fitness, key)
  return {"xla_evaluate": _analysis(lowered.compile()), "xla_update": _analysis(update.compile())}


def _flags(args) -> list[str]:
  """The shared flags, to hand to a child."""
  names = "model prompts prompt_len max_new_tokens members_per_chunk sigma learning_rate prng"
  names = names.split()
  return [f"--{k}={getattr(args, k)}" for k in names] + ["--xla" if args.xla else "--no-xla"]


def run_child(n: int, args) -> dict:
  """Runs ``--_child n`` in a fresh interpreter and returns its figures."""
  cmd = [sys.executable, "-m", "experiments.benchmarks.es_memory", f"--_child={n}", *_flags(args)]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
  if proc.returncode != 0 or not lines:
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    raise RuntimeError(f"child N={n} failed (exit {proc.returncode}): {' '.join(cmd)}")
  return json.loads(lines[-1][len(_MARKER) :])


def _mib(x: float | None) -> str:
  return "n/a" if x is None or x < 0 else f"{x / MiB:.1f}"


def _parser() -> argparse.ArgumentParser:
  parser = workload_parser(__doc__)
  parser.add_argument("--small", type=int, default=8, help="the smaller population size N")
  parser.add_argument("--large", type=int, default=32, help="the larger population size N")
  parser.add_argument("--members_per_chunk", type=int, default=4, help="M, the same for both N")
  parser.add_argument("--sigma", type=float, default=1e-3, help="σ")
  parser.add_argument(
    "--xla",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="also report XLA's compiled memory analysis (compiles both programs once more)",
  )
  parser.add_argument("--tolerance", type=float, default=0.10, help="goal: ratio <= 1 + this")
  parser.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
  return parser


def _print_figures(args, a: dict, b: dict) -> None:
  """The table of both N's figures: resident set, step growth and time, XLA's analysis."""
  rows = [
    ("peak RSS, load (MiB)", "load_peak"),
    ("peak RSS, first step incl. compile (MiB)", "first_peak"),
    ("RSS before the timed step (MiB)", "rss_before"),
    ("peak RSS, compiled step (MiB)", "step_peak"),
  ]
  print(f"\n{'':<44} {'N=' + str(args.small):>10} {'N=' + str(args.large):>10} {'ratio':>7}")
  for label, key in rows:
    print(f"{label:<44} {_mib(a[key]):>10} {_mib(b[key]):>10} {b[key] / a[key]:7.3f}")
  growth_a, growth_b = a["step_peak"] - a["rss_before"], b["step_peak"] - b["rss_before"]
  print(
    f"{'step growth above RSS before it (MiB)':<44} {_mib(growth_a):>10} {_mib(growth_b):>10} "
    f"{growth_b / max(growth_a, 1):7.3f}"
  )
  print(f"{'step seconds (compiled)':<44} {a['step_seconds']:10.2f} {b['step_seconds']:10.2f}")
  for prog in ("evaluate", "update"):
    xa, xb = a[f"xla_{prog}"], b[f"xla_{prog}"]
    if xa is None or xb is None:
      print(f"XLA memory analysis of {prog}: not available on this backend")
      continue
    for field in ("argument", "output", "temp", "total"):
      label = f"XLA {prog}: {field} (MiB)"
      ratio = f"{xb[field] / xa[field]:7.3f}" if xa[field] else f"{'-':>7}"
      print(f"{label:<44} {_mib(xa[field]):>10} {_mib(xb[field]):>10} {ratio}")
    print(
      f"{f'XLA {prog}: total / θ':<44} {xa['total'] / a['param_bytes']:10.2f} "
      f"{xb['total'] / b['param_bytes']:10.2f}"
    )


def main(argv=None):
  parser = _parser()
  args = parser.parse_args(argv)
  if args._child is not None:
    print(_MARKER + json.dumps(child(args)), flush=True)
    return

  for n in (args.small, args.large):
    if n % args.members_per_chunk:
      parser.error(f"N={n} is not divisible by --members_per_chunk={args.members_per_chunk}")
  print(
    f"model {args.model}; N={args.small} vs N={args.large}, M={args.members_per_chunk}, "
    f"P={args.prompts} prompts x T={args.max_new_tokens} tokens (prompt length "
    f"{args.prompt_len}), {args.prng} keys; one fresh process per N; load average "
    f"{os.getloadavg()[0]:.1f}"
  )
  res = {}
  for n in (args.small, args.large):
    t0 = time.perf_counter()
    res[n] = run_child(n, args)
    print(f"  child N={n} done in {time.perf_counter() - t0:.1f}s")
  a, b = res[args.small], res[args.large]
  m1 = args.members_per_chunk + 1
  print(
    f"params θ: {_mib(a['param_bytes'])} MiB (fp32); θ plus M perturbed copies = {m1} x θ = "
    f"{_mib(a['param_bytes'] * m1)} MiB"
  )
  if not a["peak_reset"]:
    print(
      "note: /proc/self/clear_refs is not writable: 'first step' and 'step' peaks are process "
      "peaks (load included)"
    )
  _print_figures(args, a, b)
  ratio = b["step_peak"] / a["step_peak"]
  first_ratio = b["first_peak"] / a["first_peak"]
  xla = ""
  if a["xla_evaluate"] and b["xla_evaluate"]:
    xla_ratio = b["xla_evaluate"]["total"] / a["xla_evaluate"]["total"]
    xla = f", XLA evaluate total {xla_ratio:.3f}"
  ok = max(ratio, first_ratio) <= 1 + args.tolerance
  print(
    f"\nratio peak memory N={args.large} / N={args.small}: compiled step {ratio:.3f}, first step "
    f"{first_ratio:.3f}{xla} (goal <= {1 + args.tolerance:.2f}: {'met' if ok else 'missed'})"
  )


if __name__ == "__main__":
  main()
