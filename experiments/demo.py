"""The README's main job: base model vs ES vs GRPO vs GRPO→ES vs ES→GRPO on the embedded default.

    make demo
    # = python -m experiments.main --config experiments/configs/demo.py --workdir runs/demo

Evaluates the base model, runs each method of `config.demo.runs` with the budget the config gives
(ES and GRPO `num_steps`, the sequential `total_steps`), evaluates each final model the same way
(greedy, Pass@1..Pass@n on held-out problems) and writes into the workdir:

  base/, es/, grpo/, grpo_es/, es_grpo/   each a full run directory (checkpoints, metrics, eval, hf)
  report.md                               the table below, the settings and the plots
  <run>/demo_seconds.json                 wall seconds of each run over all attempts (minutes)
  pass_at_k.png, entropy.png, reward.png  Pass@k vs k per method; rollout entropy and training
                                          reward over steps

Rerunning resumes: finished runs are skipped, an interrupted one continues from its checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from typing import Any

import jax
import ml_collections

from experiments import config_check, es, grpo, plots, sequential, train_lib
from experiments.logger import read_metrics

RUNS = {  # name -> (method, runner, sequential order)
  "es": ("es", es.run, None),
  "grpo": ("grpo", grpo.run, None),
  "grpo_es": ("sequential", sequential.run, "grpo_es"),
  "es_grpo": ("sequential", sequential.run, "es_grpo"),
}
log = logging.getLogger(__name__)
SECONDS_FILE = "demo_seconds.json"  # in each run's directory: wall seconds over all attempts
LABELS = {"base": "base", "es": "ES", "grpo": "GRPO", "grpo_es": "GRPO→ES", "es_grpo": "ES→GRPO"}


def _sub_config(config: ml_collections.ConfigDict, method: str, order: str | None):
  sub = ml_collections.ConfigDict(config.to_dict())
  sub.method = method
  if order is not None:
    sub.sequential.order = order
  sub.lock()
  return sub


def _table(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, "eval", "table.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["macro"]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  config_check.validate(config)  # demo.runs among them
  names = [n.strip() for n in str(config.demo.runs).split(",") if n.strip()]
  seconds: dict[str, float] = {}
  base_dir = os.path.join(workdir, "base")
  if _table(base_dir) is None:
    log.info("demo: evaluating the base model into %s", base_dir)
    with _timed(base_dir):
      train_lib.evaluate_run(_sub_config(config, "evaluate", None), base_dir)
  seconds["base"] = _seconds(base_dir)
  for name in names:
    method, runner, order = RUNS[name]
    sub_dir = os.path.join(workdir, name)
    if os.path.exists(os.path.join(sub_dir, "DONE")):
      log.info("demo: %s already finished in %s", LABELS[name], sub_dir)
    else:
      position = f"{names.index(name) + 1} of {len(names)}"
      log.info("demo: %s (%s) into %s", LABELS[name], position, sub_dir)
      with _timed(sub_dir):
        result = runner(_sub_config(config, method, order), sub_dir)
      if result.get("stopped"):
        return {"stopped": True}
    seconds[name] = _seconds(sub_dir)
  report = write_report(config, workdir, ["base", *names], seconds)
  log.info("demo: report in %s", report)
  return {"stopped": False, "report": report}


def _seconds(run_dir: str) -> float:
  """The seconds spent on a run over all attempts (NaN when never recorded)."""
  try:
    with open(os.path.join(run_dir, SECONDS_FILE)) as f:
      return float(json.load(f)["seconds"])
  except (OSError, ValueError, KeyError, TypeError):
    return float("nan")


@contextlib.contextmanager
def _timed(run_dir: str):
  """Adds the wall time of the block (finished, stopped or failed) to run_dir's SECONDS_FILE, so
  the report's minutes count every attempt of a resumed run."""
  t0 = time.perf_counter()
  try:
    yield
  finally:
    before = _seconds(run_dir)
    total = (0.0 if math.isnan(before) else before) + time.perf_counter() - t0
    if jax.process_index() == 0:
      os.makedirs(run_dir, exist_ok=True)
      with open(os.path.join(run_dir, SECONDS_FILE + ".tmp"), "w") as f:
        json.dump({"seconds": total}, f)
      os.replace(os.path.join(run_dir, SECONDS_FILE + ".tmp"), os.path.join(run_dir, SECONDS_FILE))


def _model_name(model) -> str:
  if model.source == "default":
    return "SmolLM2-135M-Instruct (bundled GGUF)"
  return f"`{model.source}` {model.path or model.preset}"


def _steps_of(config, name: str) -> str:
  if name == "base":
    return "-"
  if name in ("es", "grpo"):
    return str(config[name].num_steps)
  first, second = sequential.split_budget(config.sequential.total_steps,
                                          config.sequential.first_fraction)
  return f"{first}+{second}"


def write_report(config, workdir: str, names: list[str], seconds: dict[str, float]) -> str:
  """report.md with the evaluation table, plots and settings; returns its path."""
  rows, curves, entropy, reward = [], {}, {}, {}
  ks = None
  for name in names:
    macro = _table(os.path.join(workdir, name))
    if macro is None:
      continue
    curve = macro.get("pass_at_k_curve")
    if curve:
      curves[LABELS[name]] = (curve["k"], curve["value"])
    ks = ks or [k for k in config.eval.ks if f"pass@{k}" in macro]
    rows.append((name, macro))
    metrics_path = os.path.join(workdir, name, "metrics.jsonl")
    if os.path.exists(metrics_path):
      lines = read_metrics(metrics_path)
      for key, dest in (("entropy/mean", entropy), ("fitness/mean", reward),
                        ("reward/mean", reward)):
        series = train_lib.metric_series(lines, key)
        if series:
          dest[f"{LABELS[name]} ({key.split('/')[0]})" if name in ("grpo_es", "es_grpo")
               else LABELS[name]] = series
  figures = {}
  if curves:
    figures["pass_at_k"] = plots.plot_pass_at_k(curves, os.path.join(workdir, "pass_at_k.png"),
                                                title="Pass@k on held-out problems")
  if entropy:
    figures["entropy"] = plots.plot_metric_over_steps(
      entropy, os.path.join(workdir, "entropy.png"), ylabel="rollout token entropy (nats)",
      title="token entropy of training rollouts")
  if reward:
    figures["reward"] = plots.plot_metric_over_steps(
      reward, os.path.join(workdir, "reward.png"), ylabel="mean training reward",
      title="training reward (ES: population mean fitness; GRPO: group mean)")
  ks = ks or [1]
  head = ["run", "steps", "greedy", *[f"Pass@{k}" for k in ks], "mean length", "entropy",
          "minutes"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, m in rows:
    cells = [LABELS[name], _steps_of(config, name), f"{m.get('greedy', float('nan')):.3f}"]
    cells += [f"{m.get(f'pass@{k}', float('nan')):.3f}" for k in ks]
    nan = float("nan")
    minutes = seconds.get(name, nan) / 60
    cells += [f"{m.get('mean_length', nan):.1f}", f"{m.get('mean_entropy', nan):.3f}",
              "-" if math.isnan(minutes) else f"{minutes:.1f}"]
    lines.append("| " + " | ".join(cells) + " |")
  ev = config.eval
  text = [
    "# es_jax demo report",
    "",
    f"Model: {_model_name(config.model)}. Training task "
    f"`{config.data.task}` ({config.data.prompts_per_step} prompts per step); held-out "
    f"evaluation on {ev.limit} problems of `{ev.task}` split `{ev.split}`: one greedy answer "
    f"and n = {ev.num_samples} samples at temperature {ev.temperature} per problem, "
    f"{ev.max_new_tokens} new tokens at most.",
    "",
    *lines,
    "",
    f"ES: N = {config.es.population_size}, "
    f"{f'low rank r = {config.es.rank}' if config.es.rank else 'full rank'}, "
    f"σ = {config.es.sigma}, α = {config.es.learning_rate} "
    f"({config.es.optimizer}), {config.es.shaping} shaping, fitness at temperature "
    f"{config.es.temperature}. GRPO: G = {config.grpo.num_generations}, lr = "
    f"{config.grpo.learning_rate}, β = {config.grpo.beta}, temperature {config.grpo.temperature}. "
    f"Sequential: {config.sequential.total_steps} steps split "
    f"{config.sequential.first_fraction:.0%} / {1 - config.sequential.first_fraction:.0%}.",
    "",
    "Minutes include model loading, compilation and evaluation, summed over every attempt of a "
    "resumed run. These are small-budget runs on "
    "a small model: differences of a few problems are within noise (Pass@k standard error on "
    f"{ev.limit} problems is up to {0.5 / ev.limit ** 0.5:.2f}).",
    "",
  ]
  for name, path in figures.items():
    text += [f"![{name}]({os.path.basename(path)})", ""]
  path = os.path.join(workdir, "report.md")
  os.makedirs(workdir, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    f.write("\n".join(text))
  os.replace(path + ".tmp", path)
  return path
