"""Peak resident memory of the demo's ES stage and GRPO stage, each in a fresh process.

    python -m experiments.benchmarks.stage_memory [--config experiments/configs/demo.py]
        [--steps 2] [--stages es,grpo] [--set key=value ...]

The goal (issue 37): the GRPO stage's peak resident set at most the ES stage's on the demo
config. Each stage runs in its own interpreter (``--_child NAME``, same flags), so neither
stage's compiled programs or allocator caches count in the other's figure. A child builds the
run context as the CLI does (`experiments.run_context.make_context`: the model, the data, the
evaluator), then runs ``--steps`` steps of the stage's `train` (``es_runner.train`` or
``grpo_runner.train``) on the config's settings, with the persistent compilation cache off. It
reads the kernel's peak resident set (``VmHWM`` in ``/proc/self/status``) after loading, then
resets it (``/proc/self/clear_refs``) and reads it again after the steps:

* load: the peak while importing JAX and loading the model and data.
* stage: the peak during the steps (compiles included), the figure the goal compares.

``--set`` overrides config fields in the child (``--set grpo.micro_batch_size=8``); periodic
evaluation and checkpoints are pushed past the last step so only training is measured.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time

from experiments.benchmarks.es_memory import MiB, _peak_bytes, _reset_peak, _rss_bytes

_MARKER = "STAGE_MEMORY_CHILD_RESULT "


def _config(args, stage: str):
  """The config file's config for one stage: method, steps and the --set overrides."""
  import importlib.util

  path, _, variant = args.config.partition(":")
  spec = importlib.util.spec_from_file_location("_stage_memory_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(variant) if variant else module.get_config()
  with config.unlocked():
    config.method = stage
    config[stage].num_steps = args.steps
    config.eval.every = args.steps + 1  # no periodic evaluation inside the measured steps
    config.checkpoint.every = args.steps + 1
    for item in args.set:
      key, _, text = item.partition("=")
      try:
        value = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        value = text
      node = config
      *parents, leaf = key.split(".")
      for name in parents:
        node = node[name]
      node[leaf] = value
  return config


def child(args) -> dict:
  """Runs one stage in this process and returns its memory figures."""
  from es_jax import preemption
  from experiments import es_runner, grpo_runner, run_context, train_loop

  stage = args._child
  train = {"es": es_runner.train, "grpo": grpo_runner.train}[stage]
  with tempfile.TemporaryDirectory(prefix=f"stage_memory_{stage}_") as workdir:
    with preemption.sigterm_scope():
      ctx = run_context.make_context(_config(args, stage), workdir)
      out = {"stage": stage, "load_peak": _peak_bytes(), "peak_reset": _reset_peak()}
      out["rss_before"] = _rss_bytes()
      t0 = time.perf_counter()
      train(ctx, ctx.base_params, train_loop.Stage(stage, args.steps, f"{workdir}/ckpt"))
      out["seconds"] = time.perf_counter() - t0
      out["stage_peak"] = _peak_bytes()
  return out


def run_child(stage: str, args) -> dict:
  """Runs ``--_child stage`` in a fresh interpreter and returns its figures."""
  flags = [f"--config={args.config}", f"--steps={args.steps}"]
  flags += [f"--set={item}" for item in args.set]
  cmd = [sys.executable, "-m", "experiments.benchmarks.stage_memory", f"--_child={stage}", *flags]
  env = {**os.environ, "ES_JAX_COMPILE_CACHE": ""}  # nothing read from an earlier run
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)]
  if proc.returncode != 0 or not lines:
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    raise RuntimeError(f"child {stage} failed (exit {proc.returncode}): {' '.join(cmd)}")
  return json.loads(lines[-1][len(_MARKER) :])


def main(argv=None):
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="\n".join(__doc__.splitlines()[1:]),
  )
  parser.add_argument("--config", default="experiments/configs/demo.py", help="file[:variant]")
  parser.add_argument("--steps", type=int, default=2, help="training steps per stage")
  parser.add_argument("--stages", default="es,grpo", help="stages to run, comma-separated")
  parser.add_argument("--set", action="append", default=[], help="config override key=value")
  parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._child is not None:
    print(_MARKER + json.dumps(child(args)), flush=True)
    return
  stages = [s.strip() for s in args.stages.split(",") if s.strip()]
  print(
    f"config {args.config}, {args.steps} steps per stage, overrides {args.set or 'none'}; one "
    f"fresh process per stage; load average {os.getloadavg()[0]:.1f}"
  )
  res = {}
  for stage in stages:
    t0 = time.perf_counter()
    res[stage] = run_child(stage, args)
    print(f"  {stage} done in {time.perf_counter() - t0:.1f}s")
  print(f"\n{'':<36}" + "".join(f"{s:>10}" for s in stages))
  for label, key in (("peak RSS, load (MiB)", "load_peak"), ("RSS after load (MiB)", "rss_before")):
    print(f"{label:<36}" + "".join(f"{res[s][key] / MiB:10.1f}" for s in stages))
  print(
    f"{'peak RSS, stage (MiB)':<36}"
    + "".join(f"{res[s]['stage_peak'] / MiB:10.1f}" for s in stages)
  )
  print(f"{'stage seconds':<36}" + "".join(f"{res[s]['seconds']:10.1f}" for s in stages))
  if "es" in res and "grpo" in res:
    ratio = res["grpo"]["stage_peak"] / res["es"]["stage_peak"]
    verdict = "met" if ratio <= 1.0 else "missed"
    print(f"\nratio peak RSS GRPO / ES stage: {ratio:.3f} (goal <= 1.00: {verdict})")


if __name__ == "__main__":
  main()
