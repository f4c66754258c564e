"""The fields of the methods other than training: `config.demo`, `population_sweep`, `sparsity`,
`diversity` (with σ calibration), `fair` (the fair study) and `report`."""

from __future__ import annotations

from typing import Any

from experiments.configs.choices import DEMO_RUNS, DIVERSITY_KINDS, FAIR_STAGES
from experiments.schema.values import (
  NON_NEGATIVE,
  POSITIVE,
  PROBABILITY,
  Field,
  Group,
  boolean,
  comma_list,
  integer,
  number,
  number_sequence,
  one_of,
  one_of_registry,
  text,
)

_POSITIVES = number_sequence(POSITIVE, "need a non-empty tuple of numbers > 0")


def _stages(x: Any) -> str | None:
  return None if x == "" else comma_list(FAIR_STAGES)(x)


def _pairs(x: Any) -> str | None:
  """Comma-separated 'name:other' pairs ('' = none)."""
  items = [s.strip() for s in x.split(",") if s.strip()] if isinstance(x, str) else None
  parts = [[p.strip() for p in item.split(":")] for item in items or ()]
  ok = items is not None and all(len(p) == 2 and all(p) for p in parts)
  return None if ok else "need comma-separated 'name:other name' pairs, e.g. 'ES:GRPO'"


DEMO = Group(
  "method=demo: the base model, then each of `runs`, evaluated alike",
  {
    "runs": Field(
      "es,grpo,grpo_es,es_grpo",
      comma_list(tuple(DEMO_RUNS)),
      "the runs to compare after the base model (es_coverage is ES with es.shaping='coverage', "
      "es_null ES with shaping 'shuffled')",
    ),
  },
)

POPULATION_SWEEP = Group(
  "method=population_sweep (docs/method.md §8): ES once per N; smoothed training reward per N",
  {
    "sizes": Field(
      "8,16,32,64", comma_list(ints_from=2), "the population sizes N, comma-separated"
    ),
    "ema_decay": Field(
      0.99,
      number(0.0, 1.0, high_open=True),
      "the smoothing, a debiased EMA s_t = d·s_{t-1} + (1-d)·r_t, ŝ_t = s_t / (1 - d^t) (0 = none)",
    ),
    "tolerance": Field(
      0.01, NON_NEGATIVE, "the smallest N within this of the largest N's smoothed reward"
    ),
    "evaluate": Field(False, boolean, "run the final evaluation of each N's run"),
  },
)

SPARSITY = Group(
  "method=sparsity (docs/method.md §7): a tuned run against config.model",
  {
    "tuned": Field("", text(), "the tuned run directory, checkpoint or HF directory"),
    "taus": Field(
      (2.5e-4, 5e-4, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3),
      number_sequence(POSITIVE, "need a non-empty tuple of finite numbers > 0"),
      "relative-change thresholds τ of the sparsity curve",
    ),
    "top_fraction": Field(1e-3, PROBABILITY, "the fraction of largest changes reported"),
  },
)

DIVERSITY = Group(
  "method=diversity (docs/method.md §6): n samples per member per eval problem; JS_succ, "
  "unions, JS_pol. method=calibrate (§6.1): the population around the base model for each of "
  "`sigmas` on the first `limit` training problems; recommends the smallest σ with at least "
  "`min_changed` of greedy completions changed and mean fitness >= base - `fitness_tolerance`, "
  "extending the grid (x3 beyond an edge, at most `extensions` times) until that σ is interior "
  "and a larger σ has JS_succ above zero",
  {
    "run": Field("", text(), "an ES run dir ('' = config.model with config.es)"),
    "step": Field(-1, integer(-1), "the run's checkpoint (-1 = the newest)"),
    "key_step": Field(
      -1, integer(-1), "the step key's global step (-1: the params' step, the run's own key)"
    ),
    "population_size": Field(0, integer(0), "0 = config.es's (the run's)"),
    "sigma": Field(0.0, NON_NEGATIVE, "0 = config.es's (the run's)"),
    "num_samples": Field(8, integer(1), "n samples per member per problem"),
    "temperature": Field(0.6, POSITIVE, "the samples' temperature"),
    "limit": Field(16, integer(1), "problems measured"),
    "prompts_per_call": Field(4, integer(1), "problems decoded together"),
    "pol_prompts": Field(2, integer(1), "problems of the JS_pol estimate"),
    "pol_samples": Field(2, integer(1), "samples per problem of the JS_pol estimate"),
    "bootstrap": Field(1000, integer(1), "bootstrap resamples of the confidence intervals"),
    "correction": Field(
      "null",
      one_of_registry("es_jax.metrics:JS_CORRECTIONS"),
      "JS estimator bias correction: null | miller_madow | none (es_jax.metrics)",
    ),
    "kinds": Field(
      "es,group,control",
      comma_list(tuple(DIVERSITY_KINDS)),
      "populations measured: es, group (one policy: GRPO's G samples), control (σ = 0)",
    ),
    "checkpoints": Field(
      False, boolean, "the study at every checkpoint of `run` (JS_succ beside the Pass@n gain)"
    ),
    "sigmas": Field((1e-3, 3e-3, 1e-2, 3e-2), _POSITIVES, "calibrate: the σ grid"),
    "min_changed": Field(
      0.1, PROBABILITY, "calibrate: the share of greedy completions a σ must change"
    ),
    "fitness_tolerance": Field(
      0.05, NON_NEGATIVE, "calibrate: the mean fitness drop from the base model a σ may cause"
    ),
    "extensions": Field(3, integer(0), "calibrate: grid extensions at most"),
    "restart": Field(
      False,
      boolean,
      "calibrate: measure every σ again (rows of a stopped calibration under another config are "
      "refused, never reused)",
    ),
  },
)

FAIR = Group(
  "method=fair_study (experiments/studies/fair_study.py): σ from method=calibrate; pilots scored "
  "by "
  "training reward (ES α = ratio·σ for each of alpha_ratios, GRPO lr for each of grpo_lrs; the "
  "first listed wins ties); then demo.runs at the chosen values, the diversity study of the final "
  "ES model and the drift and sparsity of the ES-type runs against the null-walk prediction",
  {
    "calibrate": Field(True, boolean, "σ from method=calibrate (False: es.sigma)"),
    "alpha_ratios": Field((0.5, 0.25, 1.0), _POSITIVES, "ES pilots: α = ratio·σ"),
    "grpo_lrs": Field((1e-5, 3e-6, 3e-5), _POSITIVES, "GRPO pilots' learning rates"),
    "pilot_steps": Field(6, integer(1), "steps of a pilot"),
    "diversity": Field(True, boolean, "the diversity study of the final ES model"),
    "redo": Field(
      "",
      _stages,
      "stages to start over, comma-separated (calibration, pilots, runs, diversity; each later "
      "stage is redone too); a stage measured under another config is refused, naming the fields",
    ),
    "design": Field(
      1,
      one_of((1, 2)),
      "2: study v2 (experiments/studies/fair_study_v2.py): pilot grids extended until each winner "
      "is "
      "interior; ES arms at the calibrated σ, at a wider σ with measurable JS_succ and with "
      "sampled fitness; a second seed for the best ES arm and GRPO; arms that move sampled Pass@1 "
      "rerun with their null",
    ),
    "extensions": Field(2, integer(0), "design 2: pilot grid extensions (x3 beyond the edge)"),
    "sampled_temperature": Field(0.6, POSITIVE, "design 2: the sampled-fitness arm's temperature"),
    "second_seed": Field(1, integer(0), "design 2: the seed of the second-seed arms"),
    "extend_steps": Field(100, integer(1), "design 2: steps of an extended arm and its null"),
    "preregistration": Field("", text(), "the commit of the pre-registration the report names"),
  },
)

REPORT = Group(
  "method=report: a report across runs, read from their files (experiments/reports/report.py)",
  {
    "workdirs": Field(
      "",
      text(),
      "run directories, comma-separated (a demo's workdir stands for its runs; a "
      "method=diversity workdir adds JS_succ to the run it measured)",
    ),
    "names": Field(
      "",
      text(),
      "one label per run in the order they are found, or dir=label pairs ('' = from each run's "
      "config)",
    ),
    "out": Field("", text(), "the report's directory ('' = WORKDIR/report)"),
    "pairs": Field(
      "",
      _pairs,
      "'name:other' pairs, comma-separated, whose paired differences (name − other on the same "
      "problems) are tabulated, e.g. 'ES:GRPO'",
    ),
  },
)
