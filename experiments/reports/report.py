"""A report across runs: one table per evaluation task, Pareto and Pass@k plots, training curves.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/cmp \
        --config.method=report --config.report.workdirs=runs/demo/base,runs/es,runs/grpo \
        [--config.report.names=base,ES,GRPO | --config.report.names=es=ES,grpo=GRPO] \
        [--config.report.out=DIR] [--config.report.pairs="ES:GRPO,ES:base"]

Every number is read from the run directories' own files; nothing is re-run:

  eval/<label>.jsonl, .meta.json  per-problem records (experiments.evaluation.results): greedy,
  Pass@k for
                                  every k of eval/table.json, Maj@k, token entropy of the samples
                                  at the evaluation temperature, each with its standard error
  eval/timing.jsonl               evaluation seconds, summed over resumed segments
  metrics.jsonl                   steps (per stage for sequential runs), Σ step_seconds (training
                                  minutes, each step once after a resume), the last `drift`,
                                  training reward (`train/reward`; ES `fitness/mean`, GRPO
                                  `reward/mean` in runs that predate it) over steps and over
                                  `train/samples`, rollout entropy (`entropy/mean`) over steps
  diversity/table.json            JS_succ of the ES population (experiments.studies.diversity)
  config.json                     method, order and settings

A `method=diversity` workdir among the workdirs is not a row: its diversity/table.json is the
JS_succ of the run its `diversity.run` names (which must be among the runs), so a study need not
be copied into the run it measured.

`pairs` adds a table of paired differences between named runs ("ES:GRPO" is ES − GRPO on the
same problems, with its paired standard error), besides each run's difference from the first.

`names` is either one label per run, in the order the runs are found (printed in the report's
settings), or `dir=label` pairs keyed by a run's directory name (or path); runs not named keep
their default label (ES, GRPO, GRPO→ES, ... from their configs).

A workdir that is not itself a run (no eval/, metrics.jsonl or config.json), e.g. a demo's, stands
for the runs in its subdirectories; a sequential run's `stage<i>_<method>` subdirectory stands for
that stage's rows of its parent's metrics (the final evaluation belongs to the parent). A missing
piece shows as "n/a" and the report says why.

Standard errors are over problems: s/√m for the m per-problem estimates (Pass@k's unbiased
per-problem value, greedy and Maj@k's 0/1), the binomial SE for 0/1 values; the token-weighted
entropy uses the delta-method SE of a ratio. Written into `report.out` (default WORKDIR/report):
report.md, pareto.png, pass_at_k.png (one of each per task when several tasks were evaluated),
reward.png, reward_samples.png and entropy.png when a run logged them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from experiments.evaluation import results as eval_results
from experiments.reports import plots
from experiments.reports.curves import last_value, steps_cell, train_seconds, training_curves
from experiments.reports.runs import (
  NA,
  Run,
  attach_diversity,
  diversity_target,
  expand,
  load_run,
  names_by_path,
  same_dir,
  split_list,
  standard_error,
  stem,
)
from experiments.schema import check as config_check
from experiments.schema.errors import ConfigError


def difference_table(
  runs: Sequence[Run], label: str, notes: list[str], pairs: Sequence[tuple[Run, Run]] = ()
) -> list[str]:
  """Mean difference ± its paired standard error over the same problems (markdown lines; [] if
  n/a): each run minus the first (the reference, e.g. the base model), or with `pairs` each
  (run, other) pair's run minus other (e.g. ES − GRPO)."""
  if not pairs:
    ref = runs[0] if runs else None
    pairs = [(r, ref) for r in runs[1:]]
    intro = f"Difference from {ref.name if ref else ''} on the same problems"
  else:
    intro = "Differences between runs on the same problems"
  pairs = [(b, a) for b, a in pairs if label in a.per_problem and label in b.per_problem]
  if not pairs:
    return []
  metrics = ["greedy", *[f"pass@{k}" for k in _ks(runs, label)]]
  both = {r.name: r for pair in pairs for r in pair}.values()
  metrics = [m for m in metrics if all(m in r.per_problem[label] for r in both)]
  head = ["difference", *[("Δ " + m).replace("pass", "Pass") for m in metrics]]
  lines = [f"{intro} (mean ± paired standard error):", ""]
  lines += eval_results.markdown_header(head)
  for run, ref in pairs:
    a, b = ref.per_problem[label], run.per_problem[label]
    if not np.array_equal(a["index"], b["index"]):
      notes.append(f"{run.name}: {label} differences: other problems than {ref.name}'s.")
      continue
    cells = [f"{run.name} − {ref.name}"]
    for m in metrics:
      d = b[m] - a[m]
      se = standard_error(d)
      cells.append(f"{d.mean():+.3f}" + (f" ± {se:.3f}" if math.isfinite(se) else ""))
    lines.append(eval_results.markdown_row(cells))
  return lines + [""]


def _pairs(runs: Sequence[Run], pairs: Sequence[tuple[str, str]]) -> list[tuple[Run, Run]]:
  """The runs of each (name, other name) pair; an unknown name is a ValueError."""
  by_name = {r.name: r for r in runs}
  for pair in pairs:
    for name in pair:
      if name not in by_name:
        raise ConfigError(
          f"config.report.pairs: {name!r} is not a run of the report ({sorted(by_name)})."
        )
  return [(by_name[b], by_name[a]) for b, a in pairs]


def _fmt(value: float | None, se: float | None = None, digits: int = 3) -> str:
  if value is None or not math.isfinite(value):
    return NA
  text = f"{value:.{digits}f}"
  if se is not None and math.isfinite(se):
    text += f" ± {se:.{digits}f}"
  return text


def _labels(runs: Sequence[Run]) -> list[str]:
  """Every task label evaluated by some run, in first-seen order."""
  out: list[str] = []
  for run in runs:
    out += [t for t in run.tasks if t not in out]
  return out


def _ks(runs: Sequence[Run], label: str) -> list[int]:
  ks: set[int] = set()
  for run in runs:
    if label in run.tasks:
      ks |= {int(k.split("@")[1]) for k in run.tasks[label] if re.fullmatch(r"pass@\d+", k)}
  return sorted(ks)


def task_table(runs: Sequence[Run], label: str, notes: list[str]) -> list[str]:
  """The markdown lines of one task's table (one row per run)."""
  ks = _ks(runs, label)
  head = ["method", "steps", "greedy", *[f"Pass@{k}" for k in ks], *[f"Maj@{k}" for k in ks]]
  head += ["entropy (nats)", "drift", "JS_succ [95% CI]", "train min", "compile s", "eval min"]
  lines = eval_results.markdown_header(head)
  for run in runs:
    t = run.tasks.get(label)
    steps, why = steps_cell(run)
    if why:
      notes.append(f"{run.name}: steps, train min: {why}.")
    cells = [run.name, steps]
    if t is None:
      why = run.eval_missing or f"task {label} not evaluated"
      notes.append(f"{run.name}: {label} metrics: {why}.")
      cells += [NA] * (1 + 2 * len(ks) + 1)
    else:
      cells.append(_fmt(t.get("greedy"), t.get("greedy_se")))
      for kind in ("pass", "maj"):
        cells += [_fmt(t.get(f"{kind}@{k}"), t.get(f"{kind}@{k}_se")) for k in ks]
      absent = [k for k in ks if f"pass@{k}" not in t]
      if absent:
        notes.append(f"{run.name}: {label} Pass@k, Maj@k for k = {absent}: not in its eval.ks.")
      cells.append(_fmt(t.get("mean_entropy"), t.get("mean_entropy_se")))
    drift = last_value(run, "drift")
    if drift is None:
      notes.append(f"{run.name}: drift: {'not in' if run.rows else 'no'} metrics.jsonl.")
    cells.append(_fmt(drift, digits=4) if drift is not None else NA)
    if run.diversity is not None:
      d = run.diversity
      cells.append(eval_results.interval_cell(d["js_succ"], d.get("js_succ_ci")))
    else:
      cells.append(NA)
      notes.append(f"{run.name}: JS_succ: no diversity/table.json (method=diversity) in the run.")
    train = train_seconds(run)
    cells.append(_fmt(train / 60, digits=1) if train is not None else NA)
    compiling = train_seconds(run, "compile_seconds")
    cells.append(_fmt(compiling, digits=1) if compiling is not None else NA)
    if run.eval_seconds is None and t is not None:
      notes.append(f"{run.name}: eval min: no eval/timing.jsonl (an older evaluation).")
    cells.append(_fmt(run.eval_seconds / 60, digits=1) if run.eval_seconds is not None else NA)
    lines.append(eval_results.markdown_row(cells))
  return lines


def _settings(run: Run) -> str:
  c = run.config or {}
  parts = [f"`{run.path}`"]
  if c:
    parts.append(f"method {c.get('method')}, seed {c.get('seed')}")
    model = c.get("model") or {}
    parts.append(f"model {model.get('source')} {model.get('path') or model.get('preset') or ''}")
    method = c.get("method")
    es_cfg, grpo_cfg = c.get("es") or {}, c.get("grpo") or {}
    if method in ("es", "sequential") and es_cfg:
      rank = f"rank {es_cfg.get('rank')}" if es_cfg.get("rank") else "full rank"
      parts.append(
        f"ES N = {es_cfg.get('population_size')}, σ = {es_cfg.get('sigma')}, "
        f"α = {es_cfg.get('learning_rate')}, {rank}, fitness at T = {es_cfg.get('temperature')}"
      )
    if method in ("grpo", "sequential") and grpo_cfg:
      parts.append(
        f"GRPO G = {grpo_cfg.get('num_generations')}, lr = {grpo_cfg.get('learning_rate')}, "
        f"β = {grpo_cfg.get('beta')}"
      )
  else:
    parts.append("no config.json")
  for label, t in run.tasks.items():
    meta = t.get("meta") or {}
    seen = meta.get("num_seen_in_training")  # None: not recorded (an older evaluation)
    problems = f"{t['num_problems']} problems" + (
      "" if seen is None else f", {meta.get('num_distinct', NA)} distinct, {seen} seen in training"
    )
    parts.append(
      f"eval {label}: {problems}, n = {t['num_samples']} at T = "
      f"{meta.get('temperature', NA)}, ≤ {meta.get('max_new_tokens', NA)} new tokens"
    )
  return f"- {run.name}: " + "; ".join(parts) + "."


def _load_runs(workdirs: Sequence[str], names: Sequence[str]) -> list[Run]:
  """The runs `workdirs` stand for, labelled and unique, with the diversity studies among the
  workdirs attached to the runs they measured."""
  paths = expand(split_list(workdirs))
  studies = {p: t for p in paths if (t := diversity_target(p)) is not None}
  paths = [p for p in paths if p not in studies]
  if not paths:
    raise ConfigError(f"config.report.workdirs: {workdirs!r} holds only diversity studies.")
  labels = names_by_path(split_list(names), paths)
  runs = [load_run(p, label) for p, label in zip(paths, labels, strict=True)]
  for study, target in studies.items():
    hits = [r for r in runs if not r.stage and same_dir(r.path, target)]
    if not hits:
      raise ConfigError(
        f"config.report.workdirs: the diversity study {study!r} measured {target!r}, which is "
        "not among the runs; add it to the workdirs."
      )
    attach_diversity(hits[0], study)
  seen: dict[str, int] = {}
  for run in runs:  # unique names: repeated default labels get their directory name
    seen[run.name] = seen.get(run.name, 0) + 1
  for run, label in zip(runs, labels, strict=True):
    if seen[run.name] > 1 and label is None:
      run.name = f"{run.name} ({os.path.basename(os.path.normpath(run.path))})"
  if len({r.name for r in runs}) != len(runs):
    raise ConfigError(
      f"config.report.names: {[r.name for r in runs]} repeats a name; give unique names."
    )
  return runs


def _task_section(
  runs: Sequence[Run],
  label: str,
  suffix: str,
  out: str,
  figures: dict[str, str],
  notes: list[str],
  pairs: Sequence[tuple[Run, Run]] = (),
) -> list[str]:
  """One evaluation task's markdown: its table, the differences from the first run (and those
  of `pairs`), and its Pass@k and Pareto plots (written into `out`, added to `figures`)."""
  text = task_table(runs, label, notes)
  text.append("")
  text += difference_table(runs, label, notes)
  if pairs:
    text += difference_table(runs, label, notes, pairs)
  evaluated = [r for r in runs if label in r.tasks]
  curves = {
    r.name: (r.tasks[label]["pass_at_k_curve"]["k"], r.tasks[label]["pass_at_k_curve"]["value"])
    for r in evaluated
  }
  if curves:
    figures[f"pass_at_k{suffix}"] = plots.plot_pass_at_k(
      curves, os.path.join(out, f"pass_at_k{suffix}.png"), title=f"Pass@k, {label}"
    )
  common = set.intersection(*(set(_ks([r], label)) for r in evaluated)) if evaluated else {1}
  big = max(common)  # the largest k every run evaluated (1 always is)
  points = {
    r.name: (
      r.tasks[label]["pass@1"],
      r.tasks[label][f"pass@{big}"],
      r.tasks[label]["pass@1_se"],
      r.tasks[label][f"pass@{big}_se"],
    )
    for r in evaluated
  }
  if points and big > 1:
    figures[f"pareto{suffix}"] = plots.plot_pareto(
      points,
      os.path.join(out, f"pareto{suffix}.png"),
      xlabel="Pass@1",
      ylabel=f"Pass@{big}",
      title=f"Pass@1 vs Pass@{big}, {label}",
    )
    front = plots.pareto_front({k: v[:2] for k, v in points.items()})
    text += [f"Pareto front (Pass@1, Pass@{big}): {', '.join(front)}.", ""]
  elif evaluated:
    notes.append(f"{label}: Pareto plot: n/a (Pass@1 only: n = 1 sample per problem).")
  for name in (f"pareto{suffix}", f"pass_at_k{suffix}"):
    if name in figures:
      text += [f"![{name}]({os.path.basename(figures[name])})", ""]
  return text


# What the report's columns are, under the tables.
_LEGEND = (
  "Values ± standard error over problems (module `experiments.reports.report`). Pass@k: unbiased "
  "estimator over the n samples per problem; Maj@k: plurality vote of the first k answers; "
  "greedy: one temperature-0 sample; entropy: per generated token of the evaluation samples "
  "(drawn at the evaluation temperature; the model's untempered distribution), token-weighted. "
  "Drift: the last logged ‖θ−θ₀‖/‖θ₀‖. JS_succ: the ES population's success diversity "
  "(docs/method.md §6). Train min: Σ step_seconds of metrics.jsonl (each step once after a "
  "resume; periodic evaluations included, model loading not); compile s: the part of those "
  "seconds spent tracing and compiling programs, or loading them from the persistent "
  "compilation cache; eval min: the final "
  "evaluation's eval/timing.jsonl, summed over resumed segments."
)


def build(
  workdirs: Sequence[str],
  out: str,
  *,
  names: Sequence[str] = (),
  title: str = "Run comparison",
  intro: Sequence[str] = (),
  pairs: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
  """Reads the runs, writes report.md and the PNGs into `out`.

  Args:
    workdirs: run directories (or directories of runs, module docstring).
    out: the output directory (created).
    names: one label per run found (default: from each run's config).
    title: the report's heading.
    intro: markdown lines after the heading.
    pairs: (name, other name) pairs of runs whose paired differences (name − other) are
      tabulated besides the differences from the first run.

  Returns:
    {"report": report.md path, "figures": {name: png path}, "runs": {name: {task: metrics}},
    "notes": the reasons for every n/a}.

  Raises:
    ValueError: naming the field or file: bad workdirs, names, or unreadable records.
  """
  runs = _load_runs(workdirs, names)
  run_pairs = _pairs(runs, pairs)
  os.makedirs(out, exist_ok=True)
  figures: dict[str, str] = {}
  labels = _labels(runs)
  text = [f"# {title}", "", *intro]
  notes: list[str] = []
  if not labels:
    text += ["No run has a finished evaluation (eval/table.json).", ""]
    notes += [f"{run.name}: evaluation: {run.eval_missing}." for run in runs]
  for label in labels:
    suffix = "" if len(labels) <= 1 else f"_{stem(label)}"
    text += [f"## {label}" if len(labels) > 1 else f"## Evaluation: {label}", ""]
    text += _task_section(runs, label, suffix, out, figures, notes, run_pairs)
  curves, missing = training_curves(runs, out)
  figures.update(curves)
  text += [line for name in curves for line in (f"![{name}]({name}.png)", "")]
  notes += missing
  text += [_LEGEND, "", "## Runs", "", *[_settings(r) for r in runs], ""]
  if notes:
    text += ["## Not available", "", *[f"- {n}" for n in dict.fromkeys(notes)], ""]
  path = os.path.join(out, "report.md")
  eval_results.write_text(path, "\n".join(text))
  keep = ("greedy", "pass@", "maj@", "mean_entropy", "num_problems", "num_samples", "mean_length")
  summary = {
    r.name: {
      label: {k: v for k, v in t.items() if k.startswith(keep)} for label, t in r.tasks.items()
    }
    for r in runs
  }
  return {"report": path, "figures": figures, "runs": summary, "notes": list(dict.fromkeys(notes))}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="report"`: the report of `config.report.workdirs` into `report.out`."""
  config_check.validate(config)
  r = config.report
  out = r.out or os.path.join(workdir, "report")
  pairs = [tuple(part.strip() for part in item.split(":")) for item in split_list(r.pairs)]
  return build(split_list(r.workdirs), out, names=split_list(r.names), pairs=pairs)
