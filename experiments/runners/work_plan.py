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


def _demo_rows(config, names: str, base: list, final: list, prefix: str = "") -> list:
  """Each run of `names` (comma-separated experiments.configs.choices.DEMO_RUNS): its periodic
  evaluations, training and final evaluation."""
  rows = []
  for name in (n.strip() for n in str(names).split(",") if n.strip()):
    method, order, _ = DEMO_RUNS[name]
    rows += [(s, c, t) for s, c, t in base]
    rows += _method_rows(config, method, order, f"{prefix}{name}: ")
    rows += [(f"{prefix}{name}: {s}", c, t) for s, c, t in final]
  return rows


def _population_samples(config, label: str, kinds) -> list:
  """experiments.studies.diversity's sampling: per population kind, N members x n samples on
  `diversity.limit` problems (JS_pol scores some of them again; it generates none)."""
  d = config.diversity
  members = int(d.population_size or config.es.population_size)
  n = members * int(d.limit) * int(d.num_samples)
  return [(f"{label} ({kind})", n, int(config.eval.max_new_tokens)) for kind in kinds]


def _calibration(config, sigmas: list[str]) -> list:
  """experiments.studies.calibration: per σ (named by `sigmas`) the members' greedy answers and
  their samples."""
  d, es = config.diversity, config.es
  members, limit = int(d.population_size or es.population_size), int(d.limit)
  rows = []
  for s in sigmas:
    rows.append((f"calibration {s}: greedy", members * limit, int(es.max_new_tokens)))
    rows += _population_samples(config, f"calibration {s}: samples", ["es"])
  return rows


def _pilots(config, count: int | None, prefix: str = "pilots") -> list:
  """`count` pilots of each method (None: one per value of its grid), each fair.pilot_steps
  steps, training reward only."""
  f = config.fair
  rows = []
  for method, grid in (("es", f.alpha_ratios), ("grpo", f.grpo_lrs)):
    per = int(f.pilot_steps) * run_data.samples_per_step(config, method)
    tokens = int(config[method].max_new_tokens)
    n = len(grid) if count is None else count
    rows += [(f"{prefix}: {method} #{i + 1}", per, tokens) for i in range(n)]
  return rows


def _arms(config, names: list[tuple[str, str]], final: list, steps: int = 0) -> list:
  """Study v2's arms (name, method): training and final evaluation each."""
  rows = []
  for name, method in names:
    n = steps or int(config[method].num_steps)
    rows += _training(config, method, n, f"runs: {name}")
    rows += [(f"runs: {name}: {s}", c, t) for s, c, t in final]
  return rows


def _final_and_base(config, eval_problems: int) -> tuple[list, list]:
  """The final evaluation's row and the periodic evaluation's (each run's step 0 included)."""
  ev = config.eval
  final = [("final evaluation", _eval_completions(eval_problems, int(ev.num_samples)), 0)]
  final = [(s, c, int(ev.max_new_tokens)) for s, c, _ in final] if ev.final else []
  base = []
  if ev.every > 0:
    n = _eval_completions(int(ev.periodic_limit), int(ev.periodic_num_samples))
    base = [("base model periodic evaluation", n, int(ev.max_new_tokens))]
  return final, base


def _fair_study(config, final: list, base: list) -> list:
  """The rows of `method=fair_study` that always run (experiments.studies.fair_study)."""
  f, d = config.fair, config.diversity
  rows = []
  if f.calibrate:  # the base model's greedy answers, then each σ of the grid
    rows = [("calibration: base model", int(d.limit), int(config.es.max_new_tokens))]
    rows += _calibration(config, [f"σ={s:g}" for s in d.sigmas])
  rows += _pilots(config, None)
  rows += [("runs: base model evaluation", *final[0][1:])] if final else []
  if int(f.design) == 1:
    rows += _demo_rows(config, config.demo.runs, base, final, "runs: ")
  else:  # experiments.studies.fair_study_v2: four arms, the sampled-fitness arm, two seeds
    arms = ["es", "es_wide", "es_null", "grpo", "es_sampled", "best ES arm, second seed"]
    arms.append("grpo, second seed")
    rows += _arms(config, [(a, "grpo" if "grpo" in a else "es") for a in arms], final)
  kinds = [k.strip() for k in str(d.kinds).split(",") if k.strip()]
  return rows + (_population_samples(config, "diversity", kinds) if f.diversity else [])


def conditional(config: ml_collections.ConfigDict, eval_problems: int) -> list:
  """The rows `method=fair_study` adds only if an outcome asks for them, each at its most: σ grid
  extensions, pilot grid extensions (study v2) and study v2's extended arms (three ES arms and
  the null control, `fair.extend_steps` steps each); [] for other methods."""
  if config.method != "fair_study":
    return []
  f, d = config.fair, config.diversity
  grid = [f"extension #{i + 1}" for i in range(int(d.extensions))]
  extra = _calibration(config, grid) if f.calibrate else []
  if int(f.design) == 2:
    final, _ = _final_and_base(config, eval_problems)
    extra += _pilots(config, int(f.extensions), "pilot extensions")
    arms = ("es", "es_wide", "es_sampled", "es_null")
    extra += _arms(config, [(f"{a}, long", "es") for a in arms], final, int(f.extend_steps))
  return extra


def plan(config: ml_collections.ConfigDict, eval_problems: int) -> list[tuple[str, int, int]]:
  """(stage, completions, max new tokens per completion) for a training method, the demo or the
  fair study (its rows that always run: `conditional` gives the others).

  Args:
    config: a validated config.
    eval_problems: the problems of the final evaluation (all its tasks together).
  """
  final, base = _final_and_base(config, eval_problems)
  if config.method in ("es", "grpo", "sequential"):
    return [*base, *_method_rows(config, config.method, None, ""), *final]
  if config.method == "fair_study":
    return _fair_study(config, final, base)
  if config.method != "demo":
    return []
  rows = [("base model evaluation", final[0][1], final[0][2])] if final else []
  return rows + _demo_rows(config, config.demo.runs, base, final)


def summary(rows: list, num_params: int, conditional: list = ()) -> dict[str, Any]:
  """The dry run's `planned_work`: completions per stage and in all, the most new tokens they
  may hold, and the CPU estimate (`CPU_RATE`); `conditional` rows (those an outcome may add) are
  listed and totalled apart."""
  out = _totals(rows, num_params)
  if conditional:
    extra = _totals(conditional, num_params)
    out["conditional"] = {"note": "runs only if an outcome asks for it; each at its most", **extra}
  return out


def _totals(rows: list, num_params: int) -> dict[str, Any]:
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
