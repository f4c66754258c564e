"""The fair ES-vs-GRPO study (docs/results/fair_study.md): calibrated σ, equally tuned learning
rates, a null-ES control, and an evaluation large enough to see Pass@k differences up to k = 16.

    python -m experiments.main --config experiments/configs/fair_study.py --workdir runs/fair_study

Stages, each written into the workdir and skipped when a rerun finds it finished (a stopped
stage resumes from its checkpoint). Each records the config it ran under (stage_config.json,
experiments.studies.stages): a rerun under other values is refused in one line before any stage
runs; `fair.redo` starts named stages (and every later one) over. The calibration and pilots live
in experiments.studies.tuning; `fair.design=2` replaces runs/ onward by study v2's arms
(experiments.studies.fair_study_v2):

  calibration/   `method=calibrate` at the base model; σ = its recommended σ (`fair.calibrate`;
                 False keeps config.es.sigma)
  pilots/        the tuning budget, the same for both methods: one short run (`fair.pilot_steps`
                 steps, training reward only, no held-out data) per candidate: ES α = ratio · σ
                 for each of `fair.alpha_ratios`, GRPO lr for each of `fair.grpo_lrs`. The
                 candidate with the highest mean training reward over the last half of its
                 pilot wins (ties: the first listed). pilots/choice.json holds the choice.
  runs/          experiments.studies.demo's runs at the chosen σ, α, lr: base (evaluation only), ES,
  the
                 null control (es.shaping="shuffled": same drift, no signal) and GRPO, each
                 evaluated on the same held-out problems
  diversity/     `method=diversity` around the final ES model at σ (ES population, one policy, σ=0)
  (report)       ES's training reward against the null control's, step by step on the same
                 batches
  drift/         relative drift of ES and the null control against the drift a z-scored random
                 walk predicts (es_jax.metrics.null_drift), and their update-sparsity curves s_τ
  report.md      experiments.reports.report over runs/ and diversity/, with the stages' tables on
  top
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import metrics, models
from es_jax.persist import preemption
from experiments.configs.choices import FAIR_STAGES
from experiments.evaluation import data as eval_data
from experiments.evaluation import results as eval_results
from experiments.infra.logger import write_run_files
from experiments.reports import plots, report
from experiments.runners import model_io
from experiments.schema import check as config_check
from experiments.studies import demo, diversity, sparsity
from experiments.studies import fair_study_v2 as study_v2
from experiments.studies import stages as study_stages
from experiments.studies import training_signal as study_signal
from experiments.studies import tuning as study_tuning

log = logging.getLogger(__name__)


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


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="fair_study"`: the stages of the module docstring; returns {"report": path}."""
  config_check.validate(config)
  eval_data.load_eval_tasks(config)  # disjoint evaluation problems, refused before any stage
  off = {"calibration": not config.fair.calibrate, "diversity": not config.fair.diversity}
  stages = [s for s in FAIR_STAGES if not off.get(s)]
  records = {s: study_stages.fields(config, s) for s in stages}
  redo = study_stages.redo_list(config)
  study_stages.check_all(workdir, records, redo)  # before any stage runs: a refusal writes nothing
  with preemption.sigterm_scope():
    sigma = study_tuning.calibrated_sigma(config, workdir, records, redo)
    if sigma is None:
      return {"stopped": True}
    choice = study_tuning.run_pilots(config, workdir, sigma, records, redo)
    if choice.get("stopped") or preemption.preempted():
      return {"stopped": True}
    if int(config.fair.design) == 2:
      return study_v2.run(config, workdir, choice, records, redo)
    tuned = study_tuning.sub_config(
      config,
      method="demo",
      **{
        "es.sigma": sigma,
        "es.learning_rate": choice["alpha"],
        "grpo.learning_rate": choice["grpo_lr"],
      },
    )
    runs_dir = study_stages.start(workdir, "runs", records["runs"], redo)
    result = demo.run(tuned, runs_dir)
    if result.get("stopped"):
      return {"stopped": True}
    div_dir = os.path.join(workdir, "diversity")
    if config.fair.diversity:
      study_stages.start(workdir, "diversity", records["diversity"], redo)
      sub = study_tuning.sub_config(
        tuned, method="diversity", **{"diversity.run": os.path.join(runs_dir, "es")}
      )
      write_run_files(div_dir, sub)  # config.json: the report finds the run it measured
      if not os.path.exists(os.path.join(div_dir, "diversity", "table.json")):
        diversity.run(sub, div_dir)
    names = [n.strip() for n in str(config.demo.runs).split(",") if n.strip()]
    es_runs = [n for n in names if demo.RUNS[n][0] == "es"]
    intro = study_tuning.intro_lines(workdir, choice) + study_signal.signal_section(
      runs_dir, es_runs
    )
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
