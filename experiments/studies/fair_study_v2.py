"""Study v2's runs after the calibration and the pilots (`fair.design=2`; the design and its
rules: docs/results/fair_study_v2.md, the config: experiments/configs/fair_study_v2.py).

All ES arms use the pilots' α (fixed across arms, so that one null control serves them all: with
z-scored fitness an update's size does not depend on σ), full rank, N and the batches and keys of
config.seed. In runs/, in this order, each skipped when finished:

  base          the base model's evaluation
  es            greedy fitness at the calibrated σ
  es_wide       greedy fitness at the calibration's wide σ (the smallest σ above the calibrated
                one whose JS_succ interval is above zero; 3σ when no σ of the grid has one)
  es_null       the null control (shuffled fitness) at the calibrated σ
  grpo          GRPO at the pilots' learning rate
  es_sampled    sampled fitness at fair.sampled_temperature with one sample key per step shared
                by the members (the paper's Hard fitness), at the more promising σ: that of es
                or es_wide whose training reward minus the null's is higher over the last half
  <best>_seed<s>, grpo_seed<s>
                the best ES arm (the highest ES − base sampled Pass@1 of the three) and GRPO
                again with config.seed = fair.second_seed
  <arm>_long, es_null_long
                every ES arm whose ES − base Pass@1 exceeds 2 paired SE (study_rules.extend),
                and the null, for fair.extend_steps steps
Then diversity/ (the final population of the best arm) and report.md: the stages' tables, the
decision rules (experiments.studies.rules), the seeds (study_seeds) and stage times (study_times).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, NamedTuple

from es_jax.persist import preemption
from experiments.evaluation import evaluate
from experiments.infra.logger import write_run_files
from experiments.reports import report
from experiments.reports import runs as report_runs
from experiments.runners import es_runner, grpo_runner
from experiments.studies import diversity
from experiments.studies import rules as study_rules
from experiments.studies import seeds as study_seeds
from experiments.studies import stages as study_stages
from experiments.studies import times as study_times
from experiments.studies import training_signal as study_signal
from experiments.studies import tuning as study_tuning

log = logging.getLogger(__name__)

ES_ARMS = ("es", "es_wide", "es_sampled")
LABELS = {
  "base": "base",
  "es": "ES",
  "es_wide": "ES wide σ",
  "es_sampled": "ES sampled fitness",
  "es_null": "ES null (shuffled fitness)",
  "grpo": "GRPO",
}
_RUNNERS = {"es": es_runner.run, "grpo": grpo_runner.run}


class Arm(NamedTuple):
  name: str  # its directory under runs/
  method: str  # "es" | "grpo"
  updates: dict[str, Any]  # dotted config fields over the study's config


def label(name: str) -> str:
  """The report's name of run `name` ("es_wide_seed1" -> "ES wide σ (seed 1)")."""
  for suffix, text in (("_long", " (long)"), ("_seed", " (seed ")):
    if suffix in name:
      head, _, tail = name.partition(suffix)
      return LABELS[head] + text + (f"{tail})" if suffix == "_seed" else "")
  return LABELS[name]


def greedy_arms(table: dict[str, Any], choice: dict[str, Any]) -> list[Arm]:
  """base's companions of the first phase: es, es_wide, es_null, grpo (module docstring)."""
  sigma, alpha = choice["sigma"], choice["alpha"]
  wide = table.get("wide_sigma") or 3 * sigma
  es = {"es.sigma": sigma, "es.learning_rate": alpha, "es.temperature": 0.0}
  return [
    Arm("es", "es", es),
    Arm("es_wide", "es", {**es, "es.sigma": wide}),
    Arm("es_null", "es", {**es, "es.shaping": "shuffled"}),
    Arm("grpo", "grpo", {"grpo.learning_rate": choice["grpo_lr"]}),
  ]


def sampled_arm(config, arms: list[Arm], runs_dir: str) -> Arm:
  """es_sampled at the σ of es or es_wide with the larger training signal over the null."""
  signal = {}
  for arm in arms[:2]:
    ours = study_signal.step_rewards(os.path.join(runs_dir, arm.name))
    null = study_signal.step_rewards(os.path.join(runs_dir, "es_null"))
    steps = sorted(set(ours) & set(null))
    late = steps[len(steps) // 2 :]
    signal[arm.name] = sum(ours[t] - null[t] for t in late) / max(len(late), 1)
  best = max(arms[:2], key=lambda a: signal[a.name])  # max keeps es on a tie
  updates = {**best.updates, "es.temperature": float(config.fair.sampled_temperature)}
  return Arm("es_sampled", "es", {**updates, "es.share_sample_key": True})


def _per_problem(run_dir: str) -> dict[str, Any]:
  run = report_runs.load_run(run_dir)
  return next(iter(run.per_problem.values()))  # the evaluation task (the study has one)


def best_es_arm(arms: list[Arm], runs_dir: str) -> Arm:
  """The ES arm with the highest ES − base sampled Pass@1 (ties: the first listed)."""
  base = _per_problem(os.path.join(runs_dir, "base"))
  gain = {
    a.name: study_rules.paired(_per_problem(os.path.join(runs_dir, a.name)), base, "pass@1")[0]
    for a in arms
  }
  return max(arms, key=lambda a: gain[a.name])


def later_arms(config, arms: list[Arm], runs_dir: str) -> list[Arm]:
  """The second seed of the best ES arm and of GRPO, then the extended arms and their null."""
  by_name = {a.name: a for a in arms}
  es_arms = [by_name[n] for n in ES_ARMS]
  best, s = best_es_arm(es_arms, runs_dir), int(config.fair.second_seed)
  out = [
    Arm(f"{best.name}_seed{s}", "es", {**best.updates, "seed": s}),
    Arm(f"grpo_seed{s}", "grpo", {**by_name["grpo"].updates, "seed": s}),
  ]
  base = _per_problem(os.path.join(runs_dir, "base"))
  moved = [
    a for a in es_arms if study_rules.extend(_per_problem(os.path.join(runs_dir, a.name)), base)[0]
  ]
  steps = {"es.num_steps": int(config.fair.extend_steps)}
  for arm in [*moved, by_name["es_null"]] if moved else []:
    out.append(Arm(f"{arm.name}_long", "es", {**arm.updates, **steps}))
  return out


def _run_arms(config, runs_dir: str, arms: list[Arm]) -> bool:
  """Runs (and evaluates) each arm not finished; True when a SIGTERM stopped one."""
  for arm in arms:
    run_dir = os.path.join(runs_dir, arm.name)
    if os.path.exists(os.path.join(run_dir, "DONE")):
      continue
    if preemption.preempted():
      return True
    log.info("study v2: %s (%s)", arm.name, arm.updates)
    sub = study_tuning.sub_config(config, method=arm.method, **arm.updates)
    if _RUNNERS[arm.method](sub, run_dir).get("stopped"):
      return True
  return False


def run(config, workdir: str, choice: dict, records: dict, redo: list[str]) -> dict[str, Any]:
  """The runs, diversity and report of the module docstring; {"stopped", "report"}."""
  with open(os.path.join(workdir, "calibration", "calibration", "table.json")) as f:
    table = json.load(f)
  runs_dir = study_stages.start(workdir, "runs", records["runs"], redo)
  base_dir = os.path.join(runs_dir, "base")
  if not os.path.exists(os.path.join(base_dir, "eval", "table.json")):
    if evaluate.run(study_tuning.sub_config(config, method="evaluate"), base_dir).get("stopped"):
      return {"stopped": True}
  arms = greedy_arms(table, choice)
  if _run_arms(config, runs_dir, arms):
    return {"stopped": True}
  arms.append(sampled_arm(config, arms, runs_dir))
  if _run_arms(config, runs_dir, arms[-1:]):
    return {"stopped": True}
  more = later_arms(config, arms, runs_dir)
  if _run_arms(config, runs_dir, more):
    return {"stopped": True}
  arms += more
  best = best_es_arm([a for a in arms if a.name in ES_ARMS], runs_dir)
  div_dir = os.path.join(workdir, "diversity")
  if config.fair.diversity:
    study_stages.start(workdir, "diversity", records["diversity"], redo)
    sub = study_tuning.sub_config(
      config,
      method="diversity",
      **{**best.updates, "diversity.run": os.path.join(runs_dir, best.name)},
    )
    write_run_files(div_dir, sub)  # config.json: the report finds the run it measured
    if not os.path.exists(os.path.join(div_dir, "diversity", "table.json")):
      diversity.run(sub, div_dir)
  if preemption.preempted():
    return {"stopped": True}
  return {"stopped": False, "report": write_report(config, workdir, arms, table, choice, best)}


def _js_low(table: dict, arms: list[Arm], best: Arm, div_dir: str) -> dict[str, float | None]:
  """Per ES arm label, the low end of JS_succ's 95% interval: the best arm's final population
  (diversity/) when measured, else the calibration's population at the arm's σ (base model)."""
  at_sigma = {r["sigma"]: r["js_succ_ci"][0] for r in table["rows"]}
  out = {label(a.name): at_sigma.get(a.updates.get("es.sigma")) for a in arms if a.method == "es"}
  path = os.path.join(div_dir, "diversity", "table.json")
  if os.path.exists(path):
    with open(path) as f:
      rows = [r for r in json.load(f)["rows"] if r.get("kind") == "es"]
    if rows:
      out[label(best.name)] = rows[0]["js_succ_ci"][0]
  return out


def write_report(config, workdir: str, arms: list[Arm], table, choice, best: Arm) -> str:
  """report.md: the stages' tables, the rules, the seeds and the stage times, then the runs."""
  runs_dir = os.path.join(workdir, "runs")
  names = ["base", *[a.name for a in arms]]
  dirs = {n: os.path.join(runs_dir, n) for n in names}
  per = {label(n): _per_problem(d) for n, d in dirs.items()}
  es_labels = [label(a.name) for a in arms if a.method == "es" and "null" not in a.name]
  div_dir = os.path.join(workdir, "diversity")
  rules = study_rules.evaluate(per, es_labels, _js_low(table, arms, best, div_dir))
  first = {a.name: a.name.rsplit("_seed", 1)[0] for a in arms if "_seed" in a.name}
  seeds = {label(f): [per[label(f)], per[label(n)]] for n, f in first.items()}
  configs = {}
  for n, d in dirs.items():
    with open(os.path.join(d, "config.json")) as f:
      configs[n] = (d, json.load(f))
  intro = study_tuning.intro_lines(workdir, choice)
  intro += [f"Arms (runs/): {', '.join(f'{a.name} {a.updates}' for a in arms)}.", ""]
  intro += study_rules.markdown(rules, str(config.fair.preregistration))
  intro += study_seeds.markdown(seeds, per["base"]) + study_times.markdown(configs)
  intro += study_signal.signal_section(runs_dir, ["es", "es_null"])
  pairs = [(e, o) for e in es_labels for o in ("GRPO", LABELS["es_null"]) if o in per]
  run_dirs = list(dirs.values()) + ([div_dir] if config.fair.diversity else [])
  built = report.build(
    run_dirs,
    workdir,
    names=[label(n) for n in names],
    title="ES-vs-GRPO study v2",
    intro=intro,
    pairs=pairs,
  )
  return built["report"]
