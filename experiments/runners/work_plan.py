"""The work a config asks for, counted before it starts: what `--dry_run` prints.

Completions to generate per stage (training steps, periodic and final evaluations) and in all,
the new tokens they may hold (every completion at its budget: an upper bound, most end sooner),
and a time estimate on a CPU from `CPU_RATE`, a rate measured on a 2-core machine: decoding costs
about the same per parameter and token whatever the model, so the estimate scales with
parameters x tokens. It counts decoding only (updates, scoring and compilation add to it) and
is meant to show the order of magnitude, e.g. a paper-scale budget on a laptop, before it starts.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from experiments.configs.choices import DEMO_RUNS, SEQUENTIAL_ORDERS
from experiments.infra.progress import format_seconds
from experiments.runners import run_data

# Parameter-tokens per second of batched decoding on a 2-core CPU (float32): SmolLM2-135M's ES
# members decoded as one batch, 138.5 new tokens/s on a quiet machine (docs/benchmarks.md, the
# `experiments.benchmarks.es_throughput` row), times its 134.5M parameters.
CPU_RATE = 134.5e6 * 138.5


def _eval_completions(problems: int, num_samples: int) -> int:
  return problems * (num_samples + 1)  # n samples and one greedy per problem


def _training(config: ml_collections.ConfigDict, method: str, steps: int, label: str) -> list:
  """The rows (stage, completions, max new tokens each) of `steps` training steps of `method`
  and their periodic evaluations."""
  ev = config.eval
  section = config.es if method == "es" else config.grpo
  rows = [(label, steps * run_data.samples_per_step(config, method), int(section.max_new_tokens))]
  periodic = (steps - 1) // ev.every if ev.every > 0 else 0  # none after the last step
  if periodic:
    n = _eval_completions(int(ev.periodic_limit), int(ev.periodic_num_samples))
    rows.append((f"{label} periodic evaluations", periodic * n, int(ev.max_new_tokens)))
  return rows


def _method_rows(config, method: str, order: str | None, prefix: str) -> list:
  if method != "sequential":
    return _training(config, method, int(config[method].num_steps), prefix + method)
  from experiments.runners import sequential  # a run's stages, as sequential.run splits them

  first, second = sequential.split_budget(
    int(config.sequential.total_steps), float(config.sequential.first_fraction)
  )
  m1, m2 = SEQUENTIAL_ORDERS[order or config.sequential.order]
  return [
    *_training(config, m1, first, f"{prefix}{m1} (stage 1)"),
    *_training(config, m2, second, f"{prefix}{m2} (stage 2)"),
  ]


def plan(config: ml_collections.ConfigDict, eval_problems: int) -> list[tuple[str, int, int]]:
  """(stage, completions, max new tokens per completion) for a training method or the demo.

  Args:
    config: a validated config.
    eval_problems: the problems of the final evaluation (all its tasks together).
  """
  ev = config.eval
  final = [("final evaluation", _eval_completions(eval_problems, int(ev.num_samples)), 0)]
  final = [(s, c, int(ev.max_new_tokens)) for s, c, _ in final] if ev.final else []
  base = []
  if ev.every > 0:
    n = _eval_completions(int(ev.periodic_limit), int(ev.periodic_num_samples))
    base = [("base model periodic evaluation", n, int(ev.max_new_tokens))]
  if config.method in ("es", "grpo", "sequential"):
    return [*base, *_method_rows(config, config.method, None, ""), *final]
  if config.method != "demo":
    return []
  rows = [("base model evaluation", final[0][1], final[0][2])] if final else []
  for name in (n.strip() for n in str(config.demo.runs).split(",") if n.strip()):
    method, order, _ = DEMO_RUNS[name]
    rows += [(s, c, t) for s, c, t in base]
    rows += _method_rows(config, method, order, f"{name}: ")
    rows += [(f"{name}: {s}", c, t) for s, c, t in final]
  return rows


def summary(rows: list[tuple[str, int, int]], num_params: int) -> dict[str, Any]:
  """The dry run's `planned_work`: completions per stage and in all, the most new tokens they
  may hold, and the CPU estimate (`CPU_RATE`)."""
  tokens = sum(c * t for _, c, t in rows)
  seconds = tokens * num_params / CPU_RATE
  return {
    "completions": {stage: c for stage, c, _ in rows},
    "completions_total": sum(c for _, c, _ in rows),
    "new_tokens_at_most": tokens,
    "cpu_estimate": (
      f"at most about {format_seconds(seconds)} of decoding on a 2-core CPU ("
      f"{CPU_RATE:.3g} parameter-tokens/s, SmolLM2-135M's measured 138.5 tokens/s; an "
      "accelerator is far faster)"
    ),
  }
