"""Functional sparsity of a fine-tuned model (docs/method.md §7): drift, where the large updates
sit, and how Pass@1 changes when every small update is undone.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/sparsity_es \
        --config.method=sparsity --config.sparsity.tuned=runs/demo/es

For each τ in `sparsity.taus` the coordinates with 0 < |Δθ| ≤ τ are reset to the base model
(`es_jax.metrics.threshold_update`), s_τ = |{0 < |Δθ| ≤ τ}| / |{|Δθ| > 0}| is recorded, and the
thresholded model is evaluated on config.eval exactly like the base and the fully tuned model
(greedy and Pass@k, files under workdir/eval_tau=<τ>/, resumable). Also: relative drift
‖Δθ‖/‖θ₀‖, and per parameter group (embed, lm_head, final_norm, layers/<name>) its share of all
parameters, of the |Δθ| mass and of the largest `top_fraction` updates (the paper: the largest ES
updates sit mostly in normalisation weights). Writes sparsity.json, sparsity.md, sparsity.png.

`sparsity.tuned` is a run directory of es/grpo/sequential (its newest checkpoint of the last
stage), a checkpoint directory, or an HF directory (config.json + safetensors).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from es_jax import metrics, models
from es_jax.es import noise
from es_jax.models.transformer import check_param_shapes
from experiments import fields
from experiments.evaluation import data as eval_data
from experiments.evaluation import evaluate
from experiments.infra.logger import read_metrics
from experiments.reports import plots
from experiments.runners import model_io, run_data
from experiments.schema import check as config_check


def checkpoint_dir_of(path: str) -> str:
  """The checkpoint directory of a run dir (last stage for sequential runs), or `path` itself."""
  for sub in sorted(os.listdir(path)) if os.path.isdir(path) else []:
    if sub.startswith("stage2_"):
      return os.path.join(path, sub, "checkpoints")
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return os.path.join(path, "checkpoints")
  return path


def load_tuned(path: str, model_config: models.ModelConfig) -> Any:
  """Tuned params from an HF directory, a run directory or a checkpoint directory."""
  config_check.check(
    bool(path) and os.path.exists(path),
    "sparsity.tuned",
    path,
    "need an existing run, checkpoint or HF directory",
  )
  if os.path.exists(os.path.join(path, "config.json")) and any(
    f.endswith(".safetensors") for f in os.listdir(path)
  ):
    params = models.params(models.load_hf(path, tokenizer=False)[0])
  else:
    params = model_io.restore_params(checkpoint_dir_of(path))
  check_param_shapes(model_config, params, source=path)
  return params


def null_walk(run_dir: str, base: Any) -> dict[str, Any] | None:
  """The drift an ES run would have had without signal (docs/method.md §7), from its config.json
  and metrics.jsonl: {"predicted_null", "steps_moved"}; None for a directory that is not an ES
  run with SGD."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  es = saved.get("es") or {}
  if saved.get("method") != "es" or es.get("optimizer", fields.default("es.optimizer")) != "sgd":
    return None
  rows = [r for r in read_metrics(run_dir) if r.get("step", 0) > 0]
  moved = sum(1 for r in rows if r.get("fitness/std", 0.0) > 0)  # z = 0 steps do not move
  leaves = [np.asarray(p, np.float64) for p in jax.tree.leaves(base)]
  norm = float(np.sqrt(sum(float(np.sum(np.square(p))) for p in leaves)))
  size = sum(p.size for p in leaves)
  alpha, n = float(es["learning_rate"]), int(es["population_size"])
  return {"predicted_null": metrics.null_drift(alpha, size, moved, n, norm), "steps_moved": moved}


def _group(path) -> str:
  keys = [str(k) for k in noise.path_names(path)]
  return "/".join(keys[:2]) if keys[0] == "layers" else keys[0]


def update_groups(base: Any, tuned: Any, top_fraction: float) -> dict[str, dict[str, float]]:
  """Per parameter group: share of parameters, of Σ|Δθ| and of the top `top_fraction` |Δθ|."""
  deltas = jax.tree_util.tree_map_with_path(
    lambda p, b, t: np.abs(np.asarray(t, np.float32) - np.asarray(b, np.float32)).ravel(),
    base,
    tuned,
  )
  flat = jax.tree_util.tree_flatten_with_path(deltas)[0]
  every = np.concatenate([d for _, d in flat])
  k = max(1, int(round(top_fraction * every.size)))
  cutoff = np.partition(every, every.size - k)[every.size - k]
  total_mass = max(float(every.sum()), 1e-30)
  n_top = max(int((every >= cutoff).sum()), 1)
  out: dict[str, dict[str, float]] = {}
  for path, d in flat:
    g = out.setdefault(_group(path), {"params": 0.0, "mass": 0.0, "top": 0.0})
    g["params"] += d.size / every.size
    g["mass"] += float(d.sum()) / total_mass
    g["top"] += float((d >= cutoff).sum()) / n_top
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  config_check.validate(config)
  cfg = config.sparsity
  taus = [float(t) for t in cfg.taus]
  tasks = eval_data.load_eval_tasks(config)  # before the model: a refusal comes first
  model, tokenizer = model_io.load_model(config.model, seed=config.seed)
  base = models.params(model)
  tuned = jax.tree.map(jnp.asarray, load_tuned(cfg.tuned, model.config))
  evaluator = evaluate.Evaluator(config, tokenizer, run_data.run_keys(config.seed), tasks)
  delta = jax.tree.map(lambda t, b: t.astype(jnp.float32) - b.astype(jnp.float32), tuned, base)

  def evaluate_params(params, name):
    out_dir = os.path.join(workdir, f"eval_{name}")
    return evaluator.final(params, model.config, out_dir)["macro"]

  try:  # a SIGTERM stops an evaluation between batches: its jsonl resumes on a rerun
    rows = [{"model": "base", "tau": None, "sparsity": None, **evaluate_params(base, "base")}]
    rows.append({"model": "tuned", "tau": 0.0, "sparsity": 0.0, **evaluate_params(tuned, "tuned")})
    for tau in sorted(taus):
      thresholded = metrics.threshold_update(base, tuned, tau)
      s = float(metrics.update_sparsity(delta, tau))
      rows.append(
        {
          "model": f"tau={tau:g}",
          "tau": tau,
          "sparsity": s,
          **evaluate_params(thresholded, f"tau={tau:g}"),
        }
      )
  except evaluate.EvaluationStopped:
    return evaluate.stopped_result("the evaluated problems are saved")
  result = {
    "drift": float(metrics.relative_drift(tuned, base)),
    "changed_fraction": float(
      sum(int((np.asarray(d) != 0).sum()) for d in jax.tree.leaves(delta))
      / sum(np.size(d) for d in jax.tree.leaves(delta))
    ),
    "groups": update_groups(base, tuned, float(cfg.top_fraction)),
    "null_walk": null_walk(cfg.tuned, base),
    "rows": [{k: v for k, v in r.items() if k != "pass_at_k_curve"} for r in rows],
  }
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "sparsity.json"), "w") as f:
    json.dump(result, f, indent=1)
  _write_markdown(result, os.path.join(workdir, "sparsity.md"), float(cfg.top_fraction))
  tau_rows = [r for r in rows if r["tau"]]
  if tau_rows:
    xs = [r["tau"] for r in tau_rows]
    plots.plot_metric_over_steps(
      {
        "Pass@1 (thresholded)": (xs, [r["pass@1"] for r in tau_rows]),
        "Pass@1 (tuned)": (xs, [rows[1]["pass@1"]] * len(xs)),
        "Pass@1 (base)": (xs, [rows[0]["pass@1"]] * len(xs)),
        "sparsity s_τ": (xs, [r["sparsity"] for r in tau_rows]),
      },
      os.path.join(workdir, "sparsity.png"),
      ylabel="Pass@1 / fraction reset",
      xlabel="τ",
      title="functional sparsity",
    )
  return result


def _write_markdown(result: dict[str, Any], path: str, top_fraction: float) -> None:
  lines = [
    "# Functional sparsity",
    "",
    f"Relative drift ‖Δθ‖/‖θ₀‖ = {result['drift']:.4g}; coordinates changed: "
    f"{result['changed_fraction']:.2%}.",
    "",
  ]
  walk = result.get("null_walk")
  if walk:
    lines += [
      f"Drift a z-scored ES walk without signal would have: {walk['predicted_null']:.4g} "
      f"(α·sqrt(D·T/N)/‖θ₀‖ over the {walk['steps_moved']} steps whose fitness was not "
      "constant; docs/method.md §7). A measured drift near it says nothing about learning.",
      "",
    ]
  lines += [
    "| model | τ | sparsity s_τ | greedy | Pass@1 |",
    "|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    tau = "-" if r["tau"] is None else f"{r['tau']:g}"
    s = "-" if r["sparsity"] is None else f"{r['sparsity']:.3f}"
    lines.append(
      f"| {r['model']} | {tau} | {s} | {r.get('greedy', float('nan')):.3f} | {r['pass@1']:.3f} |"
    )
  lines += [
    "",
    f"| group | share of params | share of Σ|Δθ| | share of top {top_fraction:g} |",
    "|---|---|---|---|",
  ]
  for name, g in sorted(result["groups"].items(), key=lambda kv: -kv[1]["top"]):
    lines.append(f"| {name} | {g['params']:.4f} | {g['mass']:.4f} | {g['top']:.4f} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
