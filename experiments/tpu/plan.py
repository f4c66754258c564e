"""Compiles a config's programs for a TPU topology on any machine (no TPU needed) and reports
whether they fit, per chip.

    python -m experiments.tpu.plan --config experiments/configs/gsm8k_easy.py \
        --topology v5e:2x4 [--config.es.members_per_chunk=2] [--fit] [--json plan.json]

With libtpu installed (`pip install 'jax[tpu]'`; the `tpu` extra), JAX compiles for a topology
description instead of attached chips. Parameters are abstract (shapes of the configured model in
its dtype; no weights are read), laid out on the configured mesh over the topology's devices. For
each program the config's method runs (es: population evaluation, ES update, evaluation sampling;
grpo: rollout, update, evaluation; sequential and demo: all of them) it prints the compiler's
bytes per chip (arguments, outputs, temporaries, generated code) against the chip's HBM, the FLOPs
and bytes of one decode step (or one loop trip of an update) with the roofline time they imply,
and a verdict: "fits" (arguments + outputs + temporaries + code within the chip's HBM), "fits
(tight)" (over nominal HBM, but the compiler accepted it: its own limit counts what it allocates)
or "does not fit" naming the setting to change. `--fit` searches the largest es.members_per_chunk
and grpo.micro_batch_size whose verdict is "fits".

Exit status: 0 every program fits (tight or not); 1 some program does not fit; 2 bad input (one
line naming the field); 3 some program failed to compile for another reason (its error is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # parallel planners share libtpu

from es_jax.devices import memory_plan  # noqa: E402
from experiments.schema import check as config_check  # noqa: E402
from experiments.tpu import memory_check, run_cost  # noqa: E402
from experiments.tpu import programs as tpu_programs

PROGRAMS = memory_check.METHOD_PROGRAMS
EXIT_FITS, EXIT_TOO_BIG, EXIT_BAD_INPUT, EXIT_COMPILE_ERROR = 0, 1, 2, 3
# The setting that shrinks each program's memory, named in verdicts.
SETTING = {
  "es_population": "es.members_per_chunk (or es.rank > 0, or more chips on mesh.pop)",
  "es_update": "mesh.model (split the weights)",
  "eval": "eval.batch_size",
  "grpo_rollout": "data.prompts_per_step or grpo.num_generations (rows per chip)",
  "grpo_update": "grpo.micro_batch_size",
}


def _gb(n: float | None) -> str:
  return "-" if n is None else f"{n / 2**30:.2f}"


def format_table(results: list[dict[str, Any]], chip: memory_plan.Chip) -> str:
  """The per-program, per-chip table printed by the command."""
  head = (
    f"{'program':<14}{'args':>7}{'out':>7}{'temp':>7}{'code MB':>8}{'total':>7}{'HBM':>7}"
    f"{'GFLOP/step':>11}{'GB/step':>8}{'ms/step':>8}{'steps':>8}  verdict (sizes GiB per chip)"
  )
  lines = [f"chip: {chip.name}, {chip.hbm_bytes / 2**30:.2f} GiB HBM", head]
  for r in results:
    step = r.get("step") or {}
    code = "-" if r.get("code") is None else f"{r['code'] / 1e6:.1f}"
    lines.append(
      f"{r['program']:<14}{_gb(r.get('argument')):>7}{_gb(r.get('output')):>7}"
      f"{_gb(r.get('temp')):>7}{code:>8}{_gb(r.get('total')):>7}{chip.hbm_bytes / 2**30:>7.2f}"
      f"{step.get('flops', 0) / 1e9:>11.1f}{step.get('bytes', 0) / 1e9:>8.3f}"
      f"{step.get('seconds', 0) * 1e3:>8.2f}{step.get('trips', 0):>8}  {r['verdict']}"
    )
  return "\n".join(lines)


def verdict(result: dict[str, Any], chip: memory_plan.Chip) -> dict[str, Any]:
  """Adds `fits`, `tight` and `verdict` to a compile result.

  The compiler refuses (RESOURCE_EXHAUSTED) what it cannot allocate; a program it accepted
  "fits" when its arguments, outputs, temporaries and code (`total`) are within the chip's
  nominal HBM, and "fits (tight)" when `total` is over nominal HBM but the compiler still accepted
  it (its limit counts what it allocates itself): expect no headroom at run time.
  """
  name = result["program"]
  if result.get("error") and not result.get("too_big"):
    result.update(fits=False, tight=False, verdict=f"COMPILE FAILED: {result['error']}")
  elif result.get("too_big"):
    result.update(fits=False, tight=False, verdict=f"does not fit: lower {SETTING[name]}")
  elif result["total"] > chip.hbm_bytes:
    over = (result["total"] - chip.hbm_bytes) / 2**30
    result.update(
      fits=True,
      tight=True,
      verdict=f"fits (tight): {over:.2f} GiB over nominal HBM, accepted by the compiler",
    )
  else:
    result.update(fits=True, tight=False, verdict="fits")
  return result


def plan(
  config, topology: str, *, programs=None, fit: bool = False, step_cost: bool = True, **kw
) -> list[dict[str, Any]]:
  """Compiles the config's programs for `topology`; returns one result dict per program."""
  chip = memory_plan.chip_for(topology)
  programs = programs or PROGRAMS.get(config.method)
  if programs is None:
    raise ValueError(f"config.method={config.method!r}: planned methods are {sorted(PROGRAMS)}.")
  setup = tpu_programs.Setup.from_config(config, topology, **kw)
  results = []
  for name in programs:
    result = verdict(setup.compile(name, step_cost=step_cost), chip)
    if fit and name in tpu_programs.FIT_SETTINGS:
      result = verdict(setup.fit(name, chip, step_cost=step_cost) or result, chip)
    results.append(result)
  return results


def run_plan(config, results, topology: str, mix) -> dict[str, Any]:
  """`run_cost.plan_run` for the slice `topology` names (chips: devices, halved on v4 where a
  device is a TensorCore), with its Cloud TPU name ("v6e-8")."""
  chip = memory_plan.chip_for(topology)
  devices = len(tpu_programs.topology_devices(topology))
  chips = devices // 2 if chip.kind == "v4" else devices
  pop = int(results[0]["settings"]["pop"])
  plan_ = run_cost.plan_run(config, results, chip, chips=chips, pop=pop, mix=mix)
  return {**plan_, "slice": run_cost.slice_name(chip.kind, chips)}


def exit_code(results: list[dict[str, Any]]) -> int:
  if any(r.get("error") and not r.get("too_big") for r in results):
    return EXIT_COMPILE_ERROR
  return EXIT_FITS if all(r["fits"] for r in results) else EXIT_TOO_BIG


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="config file[:variant]")
  parser.add_argument("--topology", default="v5e:2x4", help="e.g. v5e:2x2, v5e:2x4, v4:2x2x1")
  parser.add_argument("--preset", default="", help="model preset (default: from config.model)")
  parser.add_argument("--dtype", default="", help="parameter dtype (default: the model's)")
  parser.add_argument("--prompt_len", type=int, default=256, help="padded prompt tokens")
  parser.add_argument("--programs", default="", help="comma-separated subset to compile")
  parser.add_argument("--fit", action="store_true", help="search the largest chunk sizes")
  parser.add_argument("--no_step_cost", action="store_true", help="skip per-step programs")
  parser.add_argument("--json", default="", help="write the results here")
  parser.add_argument(
    "--length_mix",
    default="1:1",
    help="generated lengths as fraction:probability of the budget (default 1:1, every row to it)",
  )
  args, overrides = parser.parse_known_args(argv)
  try:
    mix = run_cost.parse_length_mix(args.length_mix)
    config = config_check.validate(tpu_programs.load_config(args.config, overrides))
    results = plan(
      config,
      args.topology,
      programs=[p for p in args.programs.split(",") if p] or None,
      fit=args.fit,
      step_cost=not args.no_step_cost,
      preset=args.preset,
      dtype=args.dtype,
      prompt_len=args.prompt_len,
    )
  except (ValueError, KeyError, FileNotFoundError) as e:
    print(f"tpu_plan: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT
  print(format_table(results, memory_plan.chip_for(args.topology)))
  code, out = exit_code(results), list(results)
  try:
    run = run_plan(config, results, args.topology, mix)
  except (ValueError, KeyError) as e:  # a program without its step cost, a method without a plan
    print(f"no run plan: {e}")
  else:
    print(run_cost.format_plan(run, run["slice"]))
    out.append({"program": "run_plan", **run})
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1, default=str)
  return code


if __name__ == "__main__":
  sys.exit(main())
