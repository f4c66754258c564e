"""The fair ES-vs-GRPO study (docs/results/fair_study.md): calibrated σ, equally tuned learning
rates, a null-ES control, and an evaluation large enough to see Pass@k differences up to k = 16.

    python -m experiments.main --config experiments/configs/fair_study.py --workdir runs/fair_study

Stages, each written into the workdir and skipped when a rerun finds it finished (a stopped
stage resumes from its checkpoint):

  calibration/   `method=calibrate` at the base model; σ = its recommended σ (`fair.calibrate`;
                 False keeps config.es.sigma)
  pilots/        the tuning budget, the same for both methods: one short run (`fair.pilot_steps`
                 steps, training reward only, no held-out data) per candidate: ES α = ratio · σ
                 for each of `fair.alpha_ratios`, GRPO lr for each of `fair.grpo_lrs`. The
                 candidate with the highest mean training reward over the last half of its
                 pilot wins (ties: the first listed). pilots/choice.json holds the choice.
  runs/          experiments.demo's runs at the chosen σ, α, lr: base (evaluation only), ES, the
                 null control (es.shaping="shuffled": same drift, no signal) and GRPO, each
                 evaluated on the same held-out problems
  diversity/     `method=diversity` around the final ES model at σ (ES population, one policy, σ=0)
  (report)       ES's training reward against the null control's, step by step on the same
                 batches
  drift/         relative drift of ES and the null control against the drift a z-scored random
                 walk predicts (es_jax.metrics.null_drift), and their update-sparsity curves s_τ
  report.md      experiments.report over runs/ and diversity/, with the stages' tables on top
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import metrics, models, preemption
from experiments import (
  calibration,
  config_check,
  demo,
  diversity,
  eval_data,
  eval_results,
  model_io,
  plots,
  report,
  report_curves,
  report_runs,
  sparsity,
)
from experiments.logger import read_metrics, write_run_files

log = logging.getLogger(__name__)


def _sub(config: ml_collections.ConfigDict, **updates: Any) -> ml_collections.ConfigDict:
  """A locked copy of `config` with dotted-field `updates` ("es.sigma": 0.01, ...)."""
  sub = ml_collections.ConfigDict(config.to_dict())
  for field, value in updates.items():
    group, _, name = field.rpartition(".")
    (sub[group] if group else sub)[name] = value
  sub.lock()
  return sub


def calibrated_sigma(config: ml_collections.ConfigDict, workdir: str) -> float | None:
  """σ from the calibration stage (run here unless finished), or config.es.sigma; None when a
  SIGTERM stopped the calibration (a rerun measures the σ it had not finished)."""
  if not config.fair.calibrate:
    return float(config.es.sigma)
  out = os.path.join(workdir, "calibration")
  table = os.path.join(out, "calibration", "table.json")
  if not os.path.exists(table):
    sub = _sub(config, method="calibrate")
    write_run_files(out, sub)
    if calibration.run(sub, out).get("stopped"):
      return None
  with open(table) as f:
    sigma = json.load(f)["recommended_sigma"]
  config_check.check(
    sigma is not None,
    "fair.calibrate",
    True,
    f"no σ of diversity.sigmas met the calibration rule ({table}); widen the grid or set "
    "fair.calibrate=False with es.sigma",
  )
  return float(sigma)


def pilot_score(run_dir: str) -> float:
  """Mean training reward over the last half of a pilot's steps."""
  rows = [r for r in read_metrics(run_dir) if r.get("step", 0) > 0 and "train/reward" in r]
  config_check.check(bool(rows), "fair.pilot_steps", run_dir, "the pilot logged no reward")
  rewards = [r["train/reward"] for r in sorted(rows, key=lambda r: r["step"])]
  return float(np.mean(rewards[len(rewards) // 2 :]))


def run_pilots(config: ml_collections.ConfigDict, workdir: str, sigma: float) -> dict[str, Any]:
  """The pilots of the module docstring; {"alpha", "grpo_lr", "rows"} (cached in choice.json)."""
  out = os.path.join(workdir, "pilots")
  choice_path = os.path.join(out, "choice.json")
  if os.path.exists(choice_path):
    with open(choice_path) as f:
      return json.load(f)
  f = config.fair
  steps = config_check.positive_int(f.pilot_steps, "fair.pilot_steps")
  common = {"eval.final": False, "eval.every": 0, "export_hf": False, "checkpoint.keep": 1}
  candidates = [
    ("es", "es.learning_rate", r * sigma, f"es_alpha{r:g}sigma") for r in f.alpha_ratios
  ]
  candidates += [("grpo", "grpo.learning_rate", lr, f"grpo_lr{lr:g}") for lr in f.grpo_lrs]
  rows = []
  for method, field, value, name in candidates:
    run_dir = os.path.join(out, name)
    if not os.path.exists(os.path.join(run_dir, "DONE")):
      log.info("fair study: pilot %s (%s = %g, %d steps)", name, field, value, steps)
      sub = _sub(
        config,
        method=method,
        **{field: value, f"{method}.num_steps": steps, "es.sigma": sigma},
        **common,
      )
      result = demo.RUNS[method][1](sub, run_dir)
      if result.get("stopped"):
        return {"stopped": True}
    rows.append(
      {"method": method, "field": field, "value": value, "run": name, "score": pilot_score(run_dir)}
    )
  best = {}
  for method in ("es", "grpo"):
    mine = [r for r in rows if r["method"] == method]
    best[method] = max(mine, key=lambda r: r["score"])["value"]  # max keeps the first of ties
  choice = {"alpha": best["es"], "grpo_lr": best["grpo"], "sigma": sigma, "rows": rows}
  eval_results.write_json(choice_path, choice)
  return choice


def drift_section(config, workdir: str, runs_dir: str, names: list[str]) -> list[str]:
  """drift/drift.{json,md} and sparsity_curves.png for the ES-type runs; markdown lines."""
  out = os.path.join(workdir, "drift")
  model, _ = model_io.load_model(config.model, seed=config.seed)
  base = models.params(model)
  taus = [float(t) for t in config.sparsity.taus]
  rows, curves = [], {}
  for name in names:
    tuned = sparsity.load_tuned(os.path.join(runs_dir, name), model.config)
    delta = jax.tree.map(
      lambda t, b: np.asarray(t, np.float32) - np.asarray(b, np.float32), tuned, base
    )
    walk = sparsity.null_walk(os.path.join(runs_dir, name), base)
    rows.append(
      {
        "run": name,
        "drift": float(metrics.relative_drift(tuned, base)),
        **walk,
        "sparsity": [float(metrics.update_sparsity(delta, t)) for t in taus],
      }
    )
    curves[demo.LABELS[name]] = (taus, rows[-1]["sparsity"])
  os.makedirs(out, exist_ok=True)
  eval_results.write_json(os.path.join(out, "drift.json"), {"taus": taus, "rows": rows})
  plots.plot_metric_over_steps(
    curves,
    os.path.join(out, "sparsity_curves.png"),
    ylabel="s_τ (share of changed coordinates with |Δθ| ≤ τ)",
    xlabel="τ",
    title="update sparsity: ES vs null control",
  )
  head = [
    "run",
    "drift ‖Δθ‖/‖θ₀‖",
    "null-walk prediction",
    "steps that moved",
    *[f"s_τ={t:g}" for t in taus],
  ]
  lines = [
    "## Drift and update sparsity against the null control",
    "",
    *eval_results.markdown_header(head),
  ]
  for r in rows:
    lines.append(
      eval_results.markdown_row(
        [
          demo.LABELS[r["run"]],
          f"{r['drift']:.4g}",
          f"{r['predicted_null']:.4g}",
          r["steps_moved"],
          *[f"{s:.3f}" for s in r["sparsity"]],
        ]
      )
    )
  lines += [
    "",
    "Null-walk prediction: α·sqrt(D·T/N)/‖θ₀‖ with T the steps whose fitness was not "
    "constant (es_jax.metrics.null_drift); a drift near it is what z-scored fitness gives "
    "whether or not it carries signal.",
    "",
    "![sparsity curves](drift/sparsity_curves.png)",
    "",
  ]
  eval_results.write_text(os.path.join(out, "drift.md"), "\n".join(lines) + "\n")
  return lines


def _step_rewards(run_dir: str) -> dict[int, float]:
  """{step: training reward} of a run, as the report's reward curves read it."""
  steps, values = report_curves.reward_series(report_runs.load_run(run_dir)) or ([], [])
  return dict(zip(steps, values, strict=True))


def signal_section(runs_dir: str, names: list[str]) -> list[str]:
  """ES against each ES-type control (the null run) on the same training batches: the members'
  mean fitness per step, ES minus control (same data order, same noise; step 1 is the same
  model, hence Δ = 0), as markdown lines; [] without ES and a control."""
  if "es" not in names or len(names) < 2:
    return []
  es = _step_rewards(os.path.join(runs_dir, "es"))
  head = ["ES − control", "steps", "ES mean", "control mean", "Δ all steps", "Δ last half"]
  head.append("ES >/=/< (last half)")
  lines = [
    "## Training signal: ES against the null control on the same batches",
    "",
    *eval_results.markdown_header(head),
  ]
  for name in [n for n in names if n != "es"]:
    other = _step_rewards(os.path.join(runs_dir, name))
    steps = sorted(set(es) & set(other))
    if not steps:
      continue
    d = np.array([es[t] - other[t] for t in steps])
    late = d[len(d) // 2 :]
    cells = [
      f"ES − {demo.LABELS[name]}",
      f"{steps[0]}..{steps[-1]}",
      f"{np.mean([es[t] for t in steps]):.4f}",
      f"{np.mean([other[t] for t in steps]):.4f}",
      *[f"{x.mean():+.4f} ± {report_runs.standard_error(x):.4f}" for x in (d, late)],
      f"{int((late > 0).sum())}/{int((late == 0).sum())}/{int((late < 0).sum())}",
    ]
    lines.append(eval_results.markdown_row(cells))
  lines += [
    "",
    "Per step: the members' mean greedy fitness on that step's training batch (metrics.jsonl "
    "train/reward). ± is the standard error over steps treating them as independent; the steps "
    "of one run are correlated (each model follows from the last), so it understates the "
    "uncertainty. The held-out evaluation above is the test; this says whether ES's own "
    "training reward rose above the drift-matched control's.",
    "",
  ]
  return lines


def intro_lines(workdir: str, choice: dict[str, Any]) -> list[str]:
  """The calibration table and the pilots' choice, as markdown lines for the report's top."""
  lines = []
  cal = os.path.join(workdir, "calibration", "calibration", "table.md")
  if os.path.exists(cal):
    with open(cal) as f:
      body = f.read().split("\n", 2)[2]  # without its "# σ calibration" heading
    lines += ["## σ calibration (no learning)", "", body.strip(), ""]
  head = ["pilot", "method", "value", "mean training reward, last half"]
  lines += [
    "## Tuning: the pilots (equal budget for ES and GRPO)",
    "",
    *eval_results.markdown_header(head),
  ]
  for r in choice["rows"]:
    lines.append(
      eval_results.markdown_row(
        [r["run"], r["method"], f"{r['field']} = {r['value']:.3g}", f"{r['score']:.4f}"]
      )
    )
  lines += [
    "",
    f"Chosen: σ = {choice['sigma']:g}, ES α = {choice['alpha']:.3g}, GRPO lr = "
    f"{choice['grpo_lr']:.3g} (highest mean training reward; ties: the first listed).",
    "",
  ]
  return lines


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="fair_study"`: the stages of the module docstring; returns {"report": path}."""
  config_check.validate(config)
  eval_data.load_eval_tasks(config)  # disjoint evaluation problems, refused before any stage
  with preemption.sigterm_scope():
    sigma = calibrated_sigma(config, workdir)
    if sigma is None:
      return {"stopped": True}
    choice = run_pilots(config, workdir, sigma)
    if choice.get("stopped") or preemption.preempted():
      return {"stopped": True}
    tuned = _sub(
      config,
      method="demo",
      **{
        "es.sigma": sigma,
        "es.learning_rate": choice["alpha"],
        "grpo.learning_rate": choice["grpo_lr"],
      },
    )
    runs_dir = os.path.join(workdir, "runs")
    result = demo.run(tuned, runs_dir)
    if result.get("stopped"):
      return {"stopped": True}
    div_dir = os.path.join(workdir, "diversity")
    if config.fair.diversity:
      sub = _sub(tuned, method="diversity", **{"diversity.run": os.path.join(runs_dir, "es")})
      write_run_files(div_dir, sub)  # config.json: the report finds the run it measured
      if not os.path.exists(os.path.join(div_dir, "diversity", "table.json")):
        diversity.run(sub, div_dir)
    names = [n.strip() for n in str(config.demo.runs).split(",") if n.strip()]
    es_runs = [n for n in names if demo.RUNS[n][0] == "es"]
    intro = intro_lines(workdir, choice) + signal_section(runs_dir, es_runs)
    intro += drift_section(tuned, workdir, runs_dir, es_runs)
    dirs = [os.path.join(runs_dir, n) for n in ["base", *names]]
    if config.fair.diversity:
      dirs.append(div_dir)
    built = report.build(
      dirs,
      workdir,
      names=[demo.LABELS[n] for n in ["base", *names]],
      title="Fair ES-vs-GRPO study",
      intro=intro,
      # ES against each other run, on the same problems: the comparisons the study is for.
      pairs=[(demo.LABELS["es"], demo.LABELS[n]) for n in names if n != "es"],
    )
    return {"stopped": False, "report": built["report"]}
