"""Run time and chip-hours before launch, from compiled per-step costs (no TPU, no libtpu here).

`experiments.tpu.plan` compiles each program of a config for a topology and reports, per program,
the FLOPs and HBM bytes of one trip (one decode step, or one loop trip of an update) and the trips
per call. This module turns those into time, by the roofline of the chip
(es_jax.devices.memory_plan.CHIPS: peak bf16 FLOP/s and HBM bandwidth, sources named there):

  trip seconds    = max(flops / peak FLOP/s, bytes / HBM bandwidth)
  program seconds = trip seconds × trips  (decode programs: × the expected length fraction)
  ES step         = es_population + es_update;  GRPO step = grpo_rollout + grpo_update
  run             = steps × step + periodic evaluations + the final evaluation
  chip-hours      = run hours × chips in the slice

Decoding stops when every row of a call has ended (es_jax.decode.sampling's while loop), so a call
runs
for its longest row, not the mean one. A length mix ("0.25:0.7,1:0.3": 70% of rows end at a quarter
of the budget, 30% run to it) gives the expected longest of R rows,
E[max] / T = Σ_f P(max ≥ f) over the mix's fractions; one row in a thousand at the budget already
makes a 512-row call run to the budget. Prefill, host-side scoring and transfers are not counted:
the figures are lower bounds of the device time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from es_jax.devices import memory_plan
from experiments.configs.choices import SEQUENTIAL_ORDERS
from experiments.runners import sequential

DECODE_PROGRAMS = ("es_population", "eval", "grpo_rollout")
STEP_PROGRAMS = {"es": ("es_population", "es_update"), "grpo": ("grpo_rollout", "grpo_update")}
BUDGET = {1.0: 1.0}  # every row runs to the budget: the upper bound


def roofline_seconds(flops: float, nbytes: float, chip: memory_plan.Chip) -> float:
  """Seconds of one trip on `chip`: compute- or bandwidth-bound, whichever is slower."""
  return max(float(flops) / chip.peak_flops, float(nbytes) / chip.hbm_bandwidth)


def parse_length_mix(text: str) -> dict[float, float]:
  """ "fraction:probability,..." (fractions of the budget in (0, 1], probabilities summing to 1).

  Raises:
    ValueError: a malformed entry, a fraction outside (0, 1], or probabilities not summing to 1.
  """
  mix: dict[float, float] = {}
  for item in (s.strip() for s in text.split(",") if s.strip()):
    try:
      f, p = (float(x) for x in item.split(":"))
    except ValueError:
      raise ValueError(f"--length_mix {item!r}: need fraction:probability, e.g. 0.25:0.7") from None
    if not 0 < f <= 1 or not 0 <= p <= 1:
      raise ValueError(f"--length_mix {item!r}: fraction in (0, 1], probability in [0, 1]")
    mix[f] = mix.get(f, 0.0) + p
  if not mix or abs(sum(mix.values()) - 1) > 1e-6:
    raise ValueError(f"--length_mix {text!r}: probabilities must sum to 1")
  return mix


def mean_fraction(mix: Mapping[float, float]) -> float:
  """The mean generated length as a fraction of the budget."""
  return sum(f * p for f, p in mix.items())


def expected_max_fraction(mix: Mapping[float, float], rows: int) -> float:
  """E[longest of `rows` independent rows] / budget under `mix`."""
  out, below = 0.0, 0.0
  previous = 0.0
  for f in sorted(mix):  # P(max >= f) = 1 - P(all rows < f)
    out += (f - previous) * (1.0 - below**rows)
    below += mix[f]
    previous = f
  return out


def eval_calls(problems: int, num_samples: int, batch_size: int, greedy: bool = True) -> int:
  """Generate calls of an evaluation (experiments.evaluation.sampler's layout): per block of
  `batch_size` problems, one greedy call and ⌈problems·n / batch_size⌉ sampled calls."""
  calls = 0
  for start in range(0, problems, batch_size):
    p = min(batch_size, problems - start)
    calls += int(greedy) + math.ceil(p * num_samples / batch_size)
  return calls


def rows_per_call(name: str, config, pop: int) -> int:
  """Rows one call of a decode program generates together (its longest row ends it)."""
  if name == "es_population":
    return pop * int(config.es.members_per_chunk) * int(config.data.prompts_per_step)
  if name == "grpo_rollout":
    return int(config.data.prompts_per_step) * int(config.grpo.num_generations)
  return int(config.eval.batch_size)


def program_seconds(
  result: Mapping[str, Any], chip: memory_plan.Chip, *, fraction: float = 1.0
) -> float:
  """Seconds of one call of a compiled program (its `step` figures × trips × `fraction`)."""
  step = result.get("step") or {}
  if "flops" not in step:
    name = result.get("program")
    raise ValueError(f"{name}: no per-step cost ({step.get('error') or result.get('error')})")
  return roofline_seconds(step["flops"], step["bytes"], chip) * int(step["trips"]) * fraction


def plan_run(
  config,
  results: list[Mapping[str, Any]],
  chip: memory_plan.Chip,
  *,
  chips: int,
  pop: int,
  mix: Mapping[float, float] = BUDGET,
) -> dict[str, Any]:
  """Predicted seconds per step (per method), per evaluation and per run, and chip-hours.

  Args:
    config: the run's config (method es, grpo or sequential; steps, eval settings).
    results: `experiments.tpu.plan.plan`'s results (program, step: flops, bytes, trips).
    chip: the slice's chip; chips: chips in the slice; pop: the mesh's 'pop' axis.
    mix: the length mix (`parse_length_mix`); default: every row runs to the budget.
  """
  by_name = {r["program"]: r for r in results}

  def seconds(name: str) -> float:
    fraction = 1.0
    if name in DECODE_PROGRAMS:
      fraction = expected_max_fraction(mix, rows_per_call(name, config, pop))
    return program_seconds(by_name[name], chip, fraction=fraction)

  method = config.method
  if method == "sequential":
    steps = dict(
      zip(
        SEQUENTIAL_ORDERS[config.sequential.order],
        sequential.split_budget(
          int(config.sequential.total_steps), float(config.sequential.first_fraction)
        ),
        strict=True,
      )
    )
  elif method in STEP_PROGRAMS:
    steps = {method: int(config[method].num_steps)}
  else:
    raise ValueError(f"config.method={method!r}: run plans cover es, grpo and sequential.")
  step_s = {m: sum(seconds(p) for p in STEP_PROGRAMS[m]) for m in steps}
  ev = config.eval
  per_call = seconds("eval") if "eval" in by_name else 0.0
  final = eval_calls(int(ev.limit), int(ev.num_samples), int(ev.batch_size)) * per_call
  final *= bool(ev.final)
  periodic_n = sum(n // int(ev.every) for n in steps.values()) if int(ev.every) > 0 else 0
  periodic = per_call * eval_calls(
    int(ev.periodic_limit), int(ev.periodic_num_samples), int(ev.batch_size)
  )
  total = sum(step_s[m] * n for m, n in steps.items()) + final + periodic * periodic_n
  return {
    "steps": steps,
    "step_seconds": step_s,
    "final_eval_seconds": final,
    "periodic_eval_seconds": periodic * periodic_n,
    "run_seconds": total,
    "run_hours": total / 3600,
    "chip_hours": total / 3600 * chips,
    "mean_length_fraction": mean_fraction(mix),
    "chips": chips,
  }


def slice_name(kind: str, chips: int) -> str:
  """Cloud TPU's slice name: v4 and v5p count TensorCores (two per chip), v5e and v6e chips."""
  return f"{kind}-{chips * 2 if kind in ('v4', 'v5p') else chips}"


def format_plan(plan: Mapping[str, Any], name: str) -> str:
  """The lines tpu_plan prints under its memory table."""
  lines = [
    f"run plan on {name} (roofline lower bound; mean length {plan['mean_length_fraction']:.2f}"
    " of the budget):"
  ]
  for m, s in plan["step_seconds"].items():
    lines.append(f"  {m} step: {s:.1f} s x {plan['steps'][m]} steps")
  lines.append(
    f"  evaluations: final {plan['final_eval_seconds'] / 60:.1f} min, periodic "
    f"{plan['periodic_eval_seconds'] / 60:.1f} min"
  )
  lines.append(
    f"  this run: ~{plan['run_hours']:.1f} hours on {name}, {plan['chip_hours']:.0f} chip-hours"
  )
  return "\n".join(lines)
