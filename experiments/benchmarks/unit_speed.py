"""Per-unit speed at the fair study v1's shapes: evaluation seconds per 1,000 samples and ES
seconds per 256 completions, today's defaults against the old decode layout and v1's rates.

    python -m experiments.benchmarks.unit_speed [--problems 34] [--es_steps 2]
        [--layouts default,old] [--es_layouts default] [--skip eval|es] [--set key=value ...]
        [--baseline_tree DIR]

The work is study v1's (docs/results/fair_study.md): SmolLM2-135M-Instruct on reasoning-gym
basic_arithmetic with two one-digit terms, 32 new tokens; the evaluation draws n = 16 samples at
T = 0.6 plus one greedy answer per problem (`experiments/configs/fair_study.py`'s eval settings);
an ES step decodes 16 full-rank members x 16 prompts = 256 greedy completions. Each layout runs in
its own process with the persistent compilation cache off, through the code the CLI runs
(`run_context.make_context`, then the evaluator's final evaluation and `es_runner.train`):

* ``default``: the config as shipped (config.decode, config.eval.refill and batch size).
* ``old``: the static layout before issue 37 (``decode.kv_chunk=0``, ``decode.compactions=0``,
  ``eval.refill=False``).
* ``refill``, ``static``: the defaults with the evaluation's refill queue on, or off.
* ``before`` (``--baseline_tree DIR``): the default layout run from another source tree, e.g.
  ``git worktree add /tmp/before <commit>``: code before and after a change in one run.

ES steps are timed for ``--es_layouts`` only (default: ``default``): at 32 new tokens a
``kv_chunk`` of 128 already covers the whole cache, so both layouts run the dense step there
(`es_jax.decode.loop.cache_length`), and a full-rank ES step costs minutes on a CPU.

The evaluation figure is its wall time less the seconds spent compiling in it
(`experiments.infra.compile_cache.compile_seconds`), per 1,000 sampled completions (the greedy ones
ride along, as in v1); ES is the mean ``step_seconds`` less ``compile_seconds`` of the steps
after the first (which compiles most), per 256 completions. v1's recorded rates are wall clock
over a whole stage (compiling included, once per stage): its evaluations took 8-11 min per
128 x 16 samples (234-322 s per 1,000) and its ES steps 1.8-1.9 min (111 s). The goal (issue
37): both at least 1.5x faster than v1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_MARKER = "UNIT_SPEED_CHILD_RESULT "
V1_EVAL_SECONDS_PER_1000 = (234.0, 322.0)  # 8-11 min per 2,048 samples (fair study v1)
V1_ES_SECONDS_PER_256 = 111.0  # 1.85 min per step of 16 members x 16 prompts
LAYOUTS = {
  "default": [],
  "old": ["decode.kv_chunk=0", "decode.compactions=0", "eval.refill=False"],
  "refill": ["eval.refill=True"],
  "static": ["eval.refill=False"],
}
ONE_DIGIT = {"min_digits": 1, "max_digits": 1}  # study v1's terms (fair_study.py now uses 1-2)


def _config(args, overrides: list[str]):
  """fair_study.py's config with v1's one-digit task, the benchmark's sizes and `overrides`."""
  from experiments.benchmarks.stage_memory import apply_overrides
  from experiments.configs import fair_study

  config = fair_study.get_config()
  with config.unlocked():
    config.method = "es"
    for section in (config.data, config.eval):
      section.task_config = {**section.task_config, **ONE_DIGIT}
    # One-digit sums make about 242 distinct problems: a small training pool leaves the
    # evaluation enough problems outside it (experiments.evaluation.data draws them disjoint).
    config.data.limit = 64
    config.eval.limit = args.problems
    config.eval.keep_samples = 0
    config.es.num_steps = args.es_steps
    config.checkpoint.every = args.es_steps + 1  # no checkpoint inside the timed steps
    config.log_samples_every = 0
    config.export_hf = False
    apply_overrides(config, overrides)
  return config


def child(args) -> dict:
  """One layout's figures, measured in this process."""
  from es_jax.persist import preemption
  from experiments.infra import compile_cache
  from experiments.runners import es_runner, run_context, train_loop

  overrides = [*LAYOUTS[args._child], *args.set]
  out: dict = {"layout": args._child}
  with tempfile.TemporaryDirectory(prefix="unit_speed_") as workdir:
    with preemption.sigterm_scope():
      ctx = run_context.make_context(_config(args, overrides), workdir)
      ev = ctx.config.eval
      out["eval_settings"] = f"batch_size={ev.batch_size} refill={ev.refill}"
      out["decode"] = dict(ctx.config.decode)
      if "eval" not in args.skip:
        c0, t0 = compile_cache.compile_seconds(), time.perf_counter()
        ctx.evaluator.final(ctx.base_params, ctx.model_config, os.path.join(workdir, "eval"))
        out["eval_seconds"] = time.perf_counter() - t0
        out["eval_compile"] = compile_cache.compile_seconds() - c0
        out["eval_samples"] = int(ev.limit) * int(ev.num_samples)
      if "es" not in args.skip and args._child in args.es_layouts.split(","):
        stage = train_loop.Stage("es", args.es_steps, os.path.join(workdir, "ckpt"))
        es_runner.train(ctx, ctx.base_params, stage)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
          steps = [r for r in map(json.loads, f) if "step_seconds" in r]
        out["es_steps"] = [(r["step_seconds"], r["compile_seconds"]) for r in steps]
        out["es_completions"] = int(ctx.config.es.population_size) * int(
          ctx.config.data.prompts_per_step
        )
  return out


def run_child(layout: str, args, tree: str | None = None) -> dict:
  """Runs ``--_child layout`` in a fresh interpreter (compile cache off), from the source tree
  `tree` (None: this one; else the run labelled "before") and returns its figures."""
  flags = [f"--problems={args.problems}", f"--es_steps={args.es_steps}", f"--skip={args.skip}"]
  es_layouts = args.es_layouts.split(",")
  if tree is not None:  # the baseline tree's run times its ES steps if "before" is listed
    es_layouts = [layout] if "before" in es_layouts else []
  flags.append(f"--es_layouts={','.join(es_layouts)}")
  flags += [f"--set={item}" for item in args.set]
  cmd = [sys.executable, "-m", "experiments.benchmarks.unit_speed", f"--_child={layout}", *flags]
  env = {**os.environ, "ES_JAX_COMPILE_CACHE": ""}
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, cwd=tree)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
  if proc.returncode != 0 or not lines:
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    raise RuntimeError(f"child {layout} failed (exit {proc.returncode}): {' '.join(cmd)}")
  return json.loads(lines[-1][len(_MARKER) :])


def report(results: dict[str, dict]) -> None:
  """Prints each layout's per-unit figures, their ratio to the old layout and to v1's rates."""
  lo, hi = V1_EVAL_SECONDS_PER_1000
  per_eval, per_es = {}, {}
  for name, r in results.items():
    print(f"\n{name}: decode {r['decode']}, eval {r['eval_settings']}")
    if "eval_seconds" in r:
      work = r["eval_seconds"] - r["eval_compile"]
      per_eval[name] = 1000.0 * work / r["eval_samples"]
      print(
        f"  evaluation: {r['eval_samples']} samples in {r['eval_seconds']:.1f} s "
        f"({r['eval_compile']:.1f} s compiling): {per_eval[name]:.1f} s per 1,000 samples; "
        f"v1 {lo:.0f}-{hi:.0f}: {lo / per_eval[name]:.2f}-{hi / per_eval[name]:.2f}x faster"
      )
    if r.get("es_steps"):
      timed = [s - c for s, c in r["es_steps"][1:] or r["es_steps"]]
      per_es[name] = (sum(timed) / len(timed)) * 256.0 / r["es_completions"]
      shown = ", ".join(f"{s:.1f} s ({c:.1f} compiling)" for s, c in r["es_steps"])
      print(
        f"  ES: steps {shown}: {per_es[name]:.1f} s per 256 completions; "
        f"v1 {V1_ES_SECONDS_PER_256:.0f}: {V1_ES_SECONDS_PER_256 / per_es[name]:.2f}x faster"
      )
  for base in ("old", "before"):
    for label, table in (("evaluation", per_eval), ("ES", per_es)):
      if "default" in table and base in table:
        print(f"{label}: {base} / default = {table[base] / table['default']:.2f}x")


def parse(argv=None) -> argparse.Namespace:
  """The command line's flags (module docstring)."""
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="\n".join(__doc__.splitlines()[1:]),
  )
  parser.add_argument("--problems", type=int, default=34, help="evaluation problems (v1: 128)")
  parser.add_argument("--es_steps", type=int, default=2, help="ES steps; the first compiles")
  parser.add_argument("--layouts", default="default,old", help=f"among {', '.join(LAYOUTS)}")
  parser.add_argument(
    "--es_layouts",
    default="default",
    help="layouts whose ES steps are timed (at 32 new tokens both decode the whole cache: "
    "kv_chunk >= T compiles the dense step)",
  )
  parser.add_argument("--skip", default="", help="'eval' and/or 'es', comma-separated")
  parser.add_argument(
    "--baseline_tree",
    default="",
    help="also run the default layout from this source tree (e.g. a `git worktree` of an "
    "earlier commit), reported as 'before' (list 'before' in --es_layouts to time its ES steps)",
  )
  parser.add_argument("--set", action="append", default=[], help="config override key=value")
  parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  unknown = sorted(set(args.layouts.split(",")) - set(LAYOUTS) - {""})
  if unknown:
    parser.error(f"--layouts: unknown {unknown}; use among {sorted(LAYOUTS)}")
  return args


def main(argv=None):
  args = parse(argv)
  if args._child is not None:
    print(_MARKER + json.dumps(child(args)), flush=True)
    return
  layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
  print(
    f"study v1 shapes: {args.problems} problems x n = 16 (T = 0.6) + greedy, {args.es_steps} ES "
    f"steps of 16 x 16 greedy; one fresh process per layout; load {os.getloadavg()[0]:.1f}"
  )
  runs = [(name, name, None) for name in layouts]
  if args.baseline_tree:
    runs.append(("before", "default", os.path.abspath(args.baseline_tree)))
  results = {}
  for label, layout, tree in runs:
    t0 = time.perf_counter()
    results[label] = run_child(layout, args, tree)
    print(f"  {label} done in {time.perf_counter() - t0:.1f}s", flush=True)
  report(results)


if __name__ == "__main__":
  main()
