"""The diversity study's tables and figures (experiments.studies.diversity): table.md of one
population
study, and by_checkpoint.{md,json} with its PNGs for a study at every checkpoint of a run.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from es_jax import metrics
from experiments.evaluation import results as eval_results
from experiments.reports import plots


def markdown(rows: list[dict], source: dict[str, Any], config) -> str:
  """table.md of one study: a row per population kind, and what the columns are."""
  d = config.diversity
  head = [
    "population",
    "N",
    "n",
    "problems",
    "σ",
    "Pass@1",
    "JS_succ [95% CI]",
    "JS_succ plug-in",
    "union 1−Π(1−p_i)",
    "single 1−(1−p̄)^N",
    "union observed",
    "JS_pol",
  ]
  lines = eval_results.markdown_header(head)
  for r in rows:
    pol = "–" if r["js_pol"] is None else f"{r['js_pol']:.4f} ({r['js_pol_prompts']} prompts)"
    lines.append(
      eval_results.markdown_row(
        [
          r["label"],
          r["members"],
          r["samples"],
          r["problems"],
          f"{r['sigma']:g}",
          f"{r['pass@1']:.3f}",
          eval_results.interval_cell(r["js_succ"], r["js_succ_ci"]),
          f"{r['js_succ_plugin']:.4f}",
          f"{r['union_population']:.3f}",
          f"{r['union_single_policy']:.3f}",
          f"{r['union_observed']:.3f}",
          pol,
        ]
      )
    )
  return "\n".join(
    [
      "# Diversity study",
      "",
      f"Params at global step {source['global_step']} "
      f"({d.run or config.model.source}); ES step key fold_in(noise, {source['global_step']}) of "
      f"seed {source['seed']}. Task `{config.eval.task}` split `{config.eval.split}`, temperature "
      f"{d.temperature}, {config.eval.max_new_tokens} new tokens at most.",
      "",
      *lines,
      "",
      f"JS_succ in nats, `{d.correction}` bias correction (es_jax.metrics.js_success_from_counts), "
      f"mean over problems with a {d.bootstrap}-resample bootstrap CI over problems. Unions from "
      "the estimated p_i (plug-in); 'union observed': how often draw j of at least one member "
      "succeeds. JS_pol: Monte-Carlo policy JS on sequences (es_jax.metrics.js_policy_diversity).",
      "",
    ]
  )


def _centre_pass_at_k(row: dict[str, Any], k: int) -> float:
  """Pass@k of the centre policy from a `group` row: its N x n samples pooled per problem."""
  c = np.asarray(row["counts"]).sum(axis=0)
  return float(np.mean(metrics.pass_at_k(row["members"] * row["samples"], c, k)))


def write_by_checkpoint(out: str, by_step: list[dict[str, Any]], k: int) -> None:
  """by_checkpoint.{json,md} and PNGs: JS_succ of the ES population at each checkpoint beside
  the centre policy's Pass@1 and Pass@k gain over the first checkpoint (from the group rows)."""
  table = []
  for entry in by_step:
    kinds = {r["kind"]: r for r in entry["rows"]}
    es_row, group = kinds.get("es"), kinds.get("group")
    table.append(
      {
        "checkpoint": entry["checkpoint"],
        "global_step": entry["global_step"],
        "js_succ": es_row["js_succ"] if es_row else None,
        "js_succ_ci": es_row["js_succ_ci"] if es_row else None,
        "union_population": es_row["union_population"] if es_row else None,
        "pass@1": group["pass@1"] if group else None,
        f"pass@{k}": _centre_pass_at_k(group, k) if group else None,
      }
    )
  first = table[0][f"pass@{k}"] if table else None
  for t in table:
    t[f"pass@{k}_gain"] = None if first is None else t[f"pass@{k}"] - first
  eval_results.write_json(os.path.join(out, "by_checkpoint.json"), {"k": k, "rows": table})
  head = [
    "checkpoint",
    "global step",
    "JS_succ [95% CI]",
    "union 1−Π(1−p_i)",
    "Pass@1 (θ)",
    f"Pass@{k} (θ)",
    f"Pass@{k} gain",
  ]
  lines = [
    "# Diversity over checkpoints",
    "",
    "JS_succ of the ES population around each checkpoint (its own step key); Pass@1 and "
    f"Pass@{k} of the checkpoint itself from the GRPO-group rows (N x n samples of θ); the "
    "gain is over the first checkpoint.",
    "",
    *eval_results.markdown_header(head),
  ]

  def f(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"

  for t in table:
    js = eval_results.interval_cell(t["js_succ"], t["js_succ_ci"])
    cells = [t["checkpoint"], t["global_step"], js, f(t["union_population"]), f(t["pass@1"])]
    lines.append(eval_results.markdown_row([*cells, f(t[f"pass@{k}"]), f(t[f"pass@{k}_gain"])]))
  steps = [t["global_step"] for t in table]
  figures = (
    ("js_by_checkpoint", "js_succ", "JS_succ (nats)"),
    ("pass_gain_by_checkpoint", f"pass@{k}_gain", f"Pass@{k} gain"),
  )
  for name, key, ylabel in figures:
    pts = [(s, t[key]) for s, t in zip(steps, table, strict=True) if t[key] is not None]
    if pts:
      xs, ys = map(list, zip(*pts, strict=True))
      path = os.path.join(out, f"{name}.png")
      plots.plot_metric_over_steps(
        {"ES": (xs, ys)}, path, ylabel=ylabel, xlabel="global step", title=ylabel
      )
      lines += ["", f"![{name}]({name}.png)"]
  eval_results.write_text(os.path.join(out, "by_checkpoint.md"), "\n".join(lines) + "\n")
