"""Peak resident memory of the demo's ES stage and GRPO stage, each in a fresh process.

    python -m experiments.benchmarks.stage_memory [--config experiments/configs/demo.py]
        [--steps 2] [--stages es,grpo] [--set key=value ...]
    python -m experiments.benchmarks.stage_memory --stages \
        es,grpo,grpo@grpo.micro_batch_size=16,grpo@grpo.micro_batch_size=4@grpo.remat=True

The goal (issue 37): the GRPO stage's peak resident set at most the ES stage's on the demo
config. Each stage runs in its own interpreter (``--_child NAME``, same flags), so neither
stage's compiled programs or allocator caches count in the other's figure. A child builds the
run context as the CLI does (`experiments.runners.run_context.make_context`: the model, the data,
the evaluator), then runs ``--steps`` steps of the stage's `train` (``es_runner.train`` or
``grpo_runner.train``) on the config's settings, with the persistent compilation cache off. It
reads the kernel's peak resident set (``VmHWM`` in ``/proc/self/status``) after loading, then
resets it (``/proc/self/clear_refs``) and reads it again after the steps:

* load: the peak while importing JAX and loading the model and data.
* stage: the peak during the steps (compiles included), the figure the goal compares;
  below it the peaks within the stage's calls of its decode (ES: `evaluate_population`, GRPO:
  `rollout`), its update (`es_runner._apply`, `update_step`) and its checkpoint saves
  (`Checkpointer.save`; an asynchronous write goes on into the next call), each waited for.

``--update_analysis PROMPT_LEN`` instead prints XLA's compiled memory analysis of the GRPO update
alone (`es_jax.grpo.update.update_step(..., lower=True)` on abstract SmolLM2-135M shapes: no
weights, nothing run) for the demo's rollout (4 prompts x 8 generations, 32 new tokens, one
mini-batch) at micro-batch sizes 16, 8 and 4, with and without ``remat``.

``--set`` overrides config fields in every child (``--set grpo.micro_batch_size=8``); a stage
written ``grpo@key=value@...`` runs with those overrides too, so one run compares settings
(each GRPO stage's ratio to the ES stage is printed). Periodic evaluation and checkpoints are
pushed past the last step so only training is measured.
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
  """The config file's config for one stage: method, steps and the overrides (--set, then the
  stage's own ``@key=value`` ones)."""
  stage, *own = stage.split("@")
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
    apply_overrides(config, [*args.set, *own])
  return config


def apply_overrides(config, items: list[str]) -> None:
  """Sets ``key.path=value`` items on an unlocked config (values parsed as Python literals,
  else kept as strings)."""
  for item in items:
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


class _Phases:
  """Peak resident set per phase of a stage: each wrapped call resets the kernel's mark before
  and reads it after (outputs waited for); the stage's peak is the largest mark of all, phases
  and the time between them."""

  def __init__(self):
    self.peaks: dict[str, int] = {}
    self.outside = 0  # between the wrapped calls

  def wrap(self, owner, attr: str, phase: str) -> None:
    import jax

    call = getattr(owner, attr)

    def timed(*a, **k):
      self.outside = max(self.outside, _peak_bytes())
      _reset_peak()
      out = call(*a, **k)
      jax.block_until_ready(out)
      self.peaks[phase] = max(self.peaks.get(phase, 0), _peak_bytes())
      _reset_peak()
      return out

    setattr(owner, attr, timed)

  def stage_peak(self) -> int:
    return max(self.outside, _peak_bytes(), *self.peaks.values())


def child(args) -> dict:
  """Runs one stage in this process and returns its memory figures."""
  from es_jax.es import population
  from es_jax.grpo import update as grpo_update
  from es_jax.persist import checkpoint, preemption
  from experiments.runners import es_runner, grpo_runner, run_context, train_loop

  spec = args._child
  stage = spec.split("@")[0]
  train = {"es": es_runner.train, "grpo": grpo_runner.train}[stage]
  phases = _Phases()
  if stage == "es":
    phases.wrap(population, "evaluate_population", "decode")
    phases.wrap(es_runner, "_apply", "update")
  else:
    phases.wrap(grpo_update, "rollout", "decode")
    phases.wrap(grpo_update, "update_step", "update")
  phases.wrap(checkpoint.Checkpointer, "save", "checkpoint")
  with tempfile.TemporaryDirectory(prefix=f"stage_memory_{stage}_") as workdir:
    with preemption.sigterm_scope():
      ctx = run_context.make_context(_config(args, spec), workdir)
      out = {"stage": stage, "load_peak": _peak_bytes(), "peak_reset": _reset_peak()}
      out["rss_before"] = _rss_bytes()
      t0 = time.perf_counter()
      train(ctx, ctx.base_params, train_loop.Stage(stage, args.steps, f"{workdir}/ckpt"))
      out["seconds"] = time.perf_counter() - t0
      out["stage_peak"] = phases.stage_peak()
      out.update({f"{k}_peak": v for k, v in phases.peaks.items()})
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


def update_analysis(prompt_len: int) -> None:
  """XLA's memory plan of the demo's GRPO update on SmolLM2-135M shapes (see the docstring)."""
  import jax
  import jax.numpy as jnp

  from es_jax.grpo import update as grpo_update
  from es_jax.models import get_config, param_shapes

  config, rows, new_tokens = get_config("smollm2-135m"), 32, 32
  params = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
    param_shapes(config),
    is_leaf=lambda x: isinstance(x, tuple),
  )
  optimizer = grpo_update.make_optimizer(1e-5)
  state = grpo_update.abstract_state(params, optimizer)
  S = prompt_len + new_tokens
  arrays = {"tokens": jnp.int32, "mask": bool, "loss_mask": bool, "sampler_logp": jnp.float32}
  shapes = {k: (rows, S if k in ("tokens", "mask") else S - 1) for k in arrays}
  batch = grpo_update.GRPOBatch(
    **{k: jax.ShapeDtypeStruct(shapes[k], dtype) for k, dtype in arrays.items()},
    advantages=jax.ShapeDtypeStruct((rows,), jnp.float32),
    completion_length=new_tokens,
  )
  print(f"GRPO update, SmolLM2-135M shapes, {rows} rows of {S} tokens, float32, XLA:CPU plan (MiB)")
  print(f"{'micro-batch':>12} {'remat':>6} {'arguments':>10} {'temporaries':>12}")
  for micro in (16, 8, 4):
    for remat in (False, True):
      settings = grpo_update.UpdateSettings(rows, micro, remat=remat)
      kw = dict(config=config, optimizer=optimizer, lower=True)
      ma = grpo_update.update_step(state, batch, None, settings, **kw).compile().memory_analysis()
      print(
        f"{micro:>12} {str(remat):>6} {ma.argument_size_in_bytes / MiB:10.0f} "
        f"{ma.temp_size_in_bytes / MiB:12.0f}"
      )


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
  parser.add_argument(
    "--update_analysis", type=int, default=0, metavar="PROMPT_LEN", help="see the docstring"
  )
  parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.update_analysis:
    update_analysis(args.update_analysis)
    return
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
  rows = (
    ("peak RSS, load (MiB)", "load_peak", MiB),
    ("RSS after load (MiB)", "rss_before", MiB),
    ("peak RSS, stage (MiB)", "stage_peak", MiB),
    ("  in decode (MiB)", "decode_peak", MiB),
    ("  in update (MiB)", "update_peak", MiB),
    ("  in checkpoint (MiB)", "checkpoint_peak", MiB),
    ("stage seconds", "seconds", 1.0),
  )
  for i, s in enumerate(stages):
    print(f"  [{i}] {s}")
  print(f"\n{'':<24}" + "".join(f"{f'[{i}]':>10}" for i in range(len(stages))))
  for label, key, unit in rows:
    print(f"{label:<24}" + "".join(f"{res[s].get(key, 0) / unit:10.1f}" for s in stages))
  if "es" in res:
    for s in [s for s in stages if s.split("@")[0] == "grpo"]:
      ratio = res[s]["stage_peak"] / res["es"]["stage_peak"]
      verdict = "met" if ratio <= 1.0 else "missed"
      print(f"ratio peak RSS {s} / es: {ratio:.3f} (goal <= 1.00: {verdict})")


if __name__ == "__main__":
  main()
