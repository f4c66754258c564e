"""The README's main job: base model vs ES vs GRPO vs GRPO→ES vs ES→GRPO on the embedded default.

    make demo
    # = python -m experiments.main --config experiments/configs/demo.py --workdir runs/demo

Evaluates the base model, runs each method of `config.demo.runs` with the budget the config gives
(ES and GRPO `num_steps`, the sequential `total_steps`), evaluates each final model the same way
(greedy, Pass@1..Pass@n on held-out problems) and writes into the workdir:

  base/, es/, grpo/, grpo_es/, es_grpo/   each a full run directory (checkpoints, metrics, eval, hf)
  report.md                               experiments.reports.report over these runs: the table
                                          (± standard errors), the settings and the plots
  pareto.png, pass_at_k.png               Pass@1 vs Pass@n, Pass@k vs k per method
  entropy.png, reward.png                 rollout entropy and training reward over steps
                                          (sequential stage boundaries dotted)
  reward_samples.png                      training reward over completions generated

Rerunning resumes: finished runs are skipped, an interrupted one continues from its checkpoint.
A SIGTERM (one flag for the whole demo) saves the current run and starts no later one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import ml_collections

from es_jax.persist import preemption
from experiments.configs.choices import DEMO_RUNS
from experiments.evaluation import evaluate
from experiments.evaluation import results as eval_results
from experiments.infra.progress import format_seconds
from experiments.reports import report
from experiments.runners import es_runner, grpo_runner, sequential
from experiments.schema import check as config_check

log = logging.getLogger(__name__)

_RUNNERS = {"es": es_runner.run, "grpo": grpo_runner.run, "sequential": sequential.run}
# name -> (method, runner, sequential order, es.shaping; None: the config's), from the choices.
RUNS = {
  name: (method, _RUNNERS[method], order, shaping)
  for name, (method, order, shaping) in DEMO_RUNS.items()
}
LABELS = {
  "base": "base",
  "es": "ES",
  "es_coverage": "ES (coverage)",
  "es_null": "ES null (shuffled fitness)",
  "grpo": "GRPO",
  "grpo_es": "GRPO→ES",
  "es_grpo": "ES→GRPO",
}


def _sub_config(
  config: ml_collections.ConfigDict, method: str, order: str | None, shaping: str | None = None
):
  sub = ml_collections.ConfigDict(config.to_dict())
  sub.method = method
  if order is not None:
    sub.sequential.order = order
  if shaping is not None:
    sub.es.shaping = shaping
  sub.lock()
  return sub


def _table(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, "eval", "table.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["macro"]


class Clock:
  """The demo's overall ETA: each run left costs its training steps at the mean seconds per step
  of the runs finished so far in this process, plus one evaluation as long as the base model's
  (measured here, or read from base/eval/timing.jsonl when the base was evaluated before)."""

  def __init__(self, steps: dict[str, int]):
    self.steps, self.t0 = dict(steps), time.perf_counter()  # runs left -> training steps
    self.eval_seconds: float | None = None
    self.train_seconds = self.train_steps = 0.0

  def done(self, name: str, seconds: float | None = None) -> None:
    """Run `name` finished in `seconds` (None: finished before this process)."""
    steps = self.steps.pop(name)
    if seconds is not None and name != "base" and self.eval_seconds is not None:
      self.train_seconds += max(seconds - self.eval_seconds, 0.0)
      self.train_steps += steps

  def line(self) -> str:
    text = f"demo {format_seconds(time.perf_counter() - self.t0)} so far"
    if not self.train_steps or self.eval_seconds is None:
      return text + ", overall ETA after the first training run"
    per_step = self.train_seconds / self.train_steps
    eta = sum(n * per_step + self.eval_seconds for n in self.steps.values())
    return text + f", overall ETA {format_seconds(eta)} (runs left: {len(self.steps)})"


def _steps(config: ml_collections.ConfigDict, method: str) -> int:
  return int(config.sequential.total_steps if method == "sequential" else config[method].num_steps)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  config_check.validate(config)  # demo.runs among them
  names = [n.strip() for n in str(config.demo.runs).split(",") if n.strip()]
  clock = Clock({"base": 0, **{n: _steps(config, RUNS[n][0]) for n in names}})
  with preemption.sigterm_scope():  # one flag for every run: after a SIGTERM none starts
    base_dir = os.path.join(workdir, "base")
    if _table(base_dir) is None:
      log.info("demo: evaluating the base model into %s", base_dir)
      t0 = time.perf_counter()
      result = evaluate.run(_sub_config(config, "evaluate", None), base_dir)
      if result.get("stopped"):
        return {"stopped": True}
      clock.eval_seconds = time.perf_counter() - t0
    else:
      clock.eval_seconds = sum(eval_results.read_timing(os.path.join(base_dir, "eval")).values())
    clock.done("base")
    for i, name in enumerate(names, start=1):
      method, runner, order, shaping = RUNS[name]
      sub_dir = os.path.join(workdir, name)
      if os.path.exists(os.path.join(sub_dir, "DONE")):
        log.info("demo: %s already finished in %s", name, sub_dir)
        clock.done(name)
        continue
      if preemption.preempted():
        return {"stopped": True}
      log.info("demo: %s (%d of %d) into %s | %s", name, i, len(names), sub_dir, clock.line())
      t0 = time.perf_counter()
      result = runner(_sub_config(config, method, order, shaping), sub_dir)
      if result.get("stopped"):
        return {"stopped": True}
      clock.done(name, time.perf_counter() - t0)
    if preemption.preempted():
      return {"stopped": True}
    elapsed = format_seconds(time.perf_counter() - clock.t0)
    log.info("demo: every run finished (%s in this process)", elapsed)
    return {"stopped": False, "report": write_report(config, workdir, ["base", *names])}


def _model_name(model) -> str:
  if model.source == "default":
    return "SmolLM2-135M-Instruct (bundled GGUF)"
  return f"`{model.source}` {model.path or model.preset}"


def write_report(config, workdir: str, names: list[str]) -> str:
  """report.md and its plots in `workdir` (experiments.reports.report, from the runs' files); its
  path."""
  ev = config.eval
  base = _table(os.path.join(workdir, "base")) or {}
  problems = base.get("num_problems", ev.limit)  # what was evaluated, not the limit
  source = (
    f"`{ev.path or config.data.path}`" if ev.task == "file" else f"`{ev.task}` split `{ev.split}`"
  )
  first, second = sequential.split_budget(
    config.sequential.total_steps, config.sequential.first_fraction
  )
  intro = [
    f"Model: {_model_name(config.model)}. Training task "
    f"`{config.data.task}` ({config.data.prompts_per_step} prompts per step); held-out "
    f"evaluation on {problems} problems of {source}: one greedy answer "
    f"and n = {ev.num_samples} samples at temperature {ev.temperature} per problem, "
    f"{ev.max_new_tokens} new tokens at most.",
    "",
    f"ES: N = {config.es.population_size}, "
    f"{f'low rank r = {config.es.rank}' if config.es.rank else 'full rank'}, "
    f"σ = {config.es.sigma}, α = {config.es.learning_rate} "
    f"({config.es.optimizer}), {config.es.shaping} shaping, fitness at temperature "
    f"{config.es.temperature}. GRPO: G = {config.grpo.num_generations}, lr = "
    f"{config.grpo.learning_rate}, β = {config.grpo.beta}, temperature {config.grpo.temperature}. "
    f"Sequential: {config.sequential.total_steps} steps split {first} + {second}.",
    "",
    "These are small-budget runs on a small model: differences of a few problems are within "
    "noise (see the standard errors).",
    "",
  ]
  result = report.build(
    [os.path.join(workdir, n) for n in names],
    workdir,
    names=[LABELS[n] for n in names],
    title="es_jax demo report",
    intro=intro,
  )
  return result["report"]
