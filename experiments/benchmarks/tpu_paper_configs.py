"""Compiles the paper configs at full size for TPU topologies and prints the planner table, with
es_jax.devices.memory_plan's predicted bytes beside the compiled ones (ratio = predicted /
compiled).

    JAX_PLATFORMS=cpu python -m experiments.benchmarks.tpu_paper_configs [--cases easy_es_v5e,...]
        [--json out.json]

Needs libtpu (the `tpu` extra); no TPU. Each full-size compile takes minutes of CPU.
"""

from __future__ import annotations

import argparse
import json
import time

from es_jax.devices import memory_plan
from experiments.tpu import memory_check
from experiments.tpu import plan as tpu_plan
from experiments.tpu import programs as tpu_programs

CONFIGS = "experiments/configs/"
CASES = {  # name: (config, topology, overrides, programs or None for the method's)
  "easy_es_v5e": (CONFIGS + "gsm8k_easy.py", "v5e:2x4", ["--config.method=es"], None),
  "easy_es_v4": (CONFIGS + "gsm8k_easy.py", "v4:2x2x1", ["--config.method=es"], None),
  "easy_grpo_v5e": (CONFIGS + "gsm8k_easy.py", "v5e:2x4", ["--config.method=grpo"], None),
  "hard_es_v5e32": (CONFIGS + "deepscaler_hard.py", "v5e:4x8", ["--config.method=es"], None),
}


def run_case(name: str, step_cost: bool) -> list[dict]:
  path, topology, overrides, programs = CASES[name]
  config = tpu_programs.load_config(path, overrides)
  start = time.time()
  results = tpu_plan.plan(config, topology, programs=programs, step_cost=step_cost)
  setup_mesh = results[0]["settings"]
  cfg = tpu_programs.model_config_for(config.model)
  for r in results:
    est = memory_check.predict(
      r["program"],
      config,
      cfg,
      pop=setup_mesh["pop"],
      model=setup_mesh["model"],
      prompt_len=256,
      chip=topology.split(":")[0],
    )
    r["predicted"] = {
      "argument": est.argument,
      "output": est.output,
      "temp": est.temp,
      "total": est.total,
    }
    r["case"] = name
  print(f"== {name}: {path} on {topology} {' '.join(overrides)} ({time.time() - start:.0f} s)")
  print(tpu_plan.format_table(results, memory_plan.chip_for(topology)))
  for r in results:
    if r.get("temp"):
      ratio = r["predicted"]["temp"] / r["temp"]
      print(
        f"  {r['program']}: predicted temp {r['predicted']['temp'] / 2**30:.2f} GiB, "
        f"compiled {r['temp'] / 2**30:.2f} GiB, ratio {ratio:.2f}"
      )
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--no_step_cost", action="store_true")
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  out = []
  for name in args.cases.split(","):
    out += run_case(name, not args.no_step_cost)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
  main()
