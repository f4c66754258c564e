"""σ calibration without learning (docs/method.md §6.1): how far apart the members of an ES
population around the base model are, for each σ of a grid, before any update is taken.

    python -m experiments.main --config experiments/configs/fair_study.py \
        --workdir runs/calibration --config.method=calibrate

For each σ in `diversity.sigmas`, the population θ + σ ε_i (i < N, N = `diversity.population_size`
or `es.population_size`; noise, rank and arithmetic of `config.es`; the step key of global step 0)
is measured on the first `diversity.limit` problems of the training pool (`config.data`):

  fitness      greedy decoding (es.max_new_tokens), the training reward: each member's mean over
               the problems; its spread (std over members) and mean against the base model's
               (paired standard error over problems)
  changed      the share of (member, problem) greedy completions whose text differs from the base
               model's; `success changed`: the share whose verdict (reward >= 1) differs
  JS_succ      n = `diversity.num_samples` samples per member per problem at
               `diversity.temperature` (experiments.studies.diversity.Study), with a bootstrap CI;
               JS_pol
  survives     cos(cast(θ + σε) − cast(θ), σε) for member 0: how much of the change the rounded
               weights carry is the intended perturbation, after rounding to the compute dtype
               (and to bfloat16, the paper's). 1 when nothing rounds; below 1 when σε is small
               against the dtype's spacing, where a few weights jump by a whole ulp and the rest
               do not move (the jumps follow σε on average, so a norm ratio or a projection
               reads ~1 there too: only the cosine sees the rounding noise); and σ / RMS(θ)

Recommended σ (the rule, also printed under the table): the smallest σ of the grid at which
(a) at least `diversity.min_changed` of the greedy completions differ from the base model's and
(b) the members' mean fitness is at least the base fitness − `diversity.fitness_tolerance`.
Rule (a) asks that members measurably answer differently (the fitness can only rank members that
differ), rule (b) that the perturbation does not simply break the model. So that the rule cannot
return an edge of the grid, the grid is extended (σ_min / 3 below, σ_max · 3 above, at most
`diversity.extensions` times; `extension`) until the recommended σ is interior and a larger σ has
JS_succ above zero (`wide_sigma`, the σ of study v2's wide arm). If no σ meets both rules, none is
recommended and the table says which rule failed. Writes workdir/calibration/{table.md,json}.

A stopped calibration keeps its finished rows in rows.partial.json with the config fields they
were measured under (experiments.studies.stages.fields); a rerun under other values is refused in
one line (`diversity.restart=True` measures every σ again).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from es_jax import models
from es_jax.decode import sampling
from es_jax.es import members, noise, population
from es_jax.persist import preemption
from experiments.evaluation import results as eval_results
from experiments.runners import model_io, run_data, train_loop
from experiments.schema import check as config_check
from experiments.studies import diversity
from experiments.studies import stages as study_stages

log = logging.getLogger(__name__)


def survival(params32, compute_dtype, step_key, sigma: float, spec: noise.NoiseSpec) -> dict:
  """The share of member 0's perturbation that survives rounding (module docstring); cheap
  (no decoding), so `run` recomputes it for every row instead of caching it."""
  leaves = jax.tree.leaves(params32)
  size = sum(p.size for p in leaves)
  rms = float(jnp.sqrt(sum(jnp.sum(jnp.square(p)) for p in leaves) / size))

  @jax.jit
  def kept(p_tree, s, probe):
    member = members.perturb_member(p_tree, step_key, 0, s, spec)
    dot = applied_sq = intended_sq = 0.0
    for p, m in zip(jax.tree.leaves(p_tree), jax.tree.leaves(member), strict=True):
      applied = m.astype(probe.dtype).astype(jnp.float32) - p.astype(probe.dtype)
      intended = m - p  # σε as the float32 member carries it
      dot = dot + jnp.sum(applied * intended)
      applied_sq = applied_sq + jnp.sum(jnp.square(applied))
      intended_sq = intended_sq + jnp.sum(jnp.square(intended))
    return dot / jnp.sqrt(applied_sq * intended_sq)

  s = jnp.float32(sigma)
  return {
    "survives_compute": float(kept(params32, s, jnp.zeros((), compute_dtype))),
    "survives_bf16": float(kept(params32, s, jnp.zeros((), jnp.bfloat16))),
    "relative_sigma": sigma / rms,
  }


def _greedy(source, spec, ids, mask, sigma: float, decoding, mesh, chunk: int):
  """Greedy tokens and masks [N, P, T] of the population at `sigma`."""
  out = population.population_completions(
    source["params"],
    jnp.asarray(ids),
    jnp.asarray(mask),
    source["step_key"],
    source["step_key"],  # unused by greedy decoding
    decoding.as_float32(),
    population.PopulationSettings(
      spec, jnp.float32(sigma), source["model_config"], chunk, mesh, share_sample_key=True
    ),
  )
  return np.asarray(out.tokens), np.asarray(out.mask, bool)


def greedy_row(study, spec, base, examples, sigma: float, score) -> dict[str, Any]:
  """Fitness spread and changed answers of the greedy population at `sigma` (docstring)."""
  ids, mask = base["ids"], base["mask"]
  tokens, tmask = _greedy(
    study.source, spec, ids, mask, sigma, base["decoding"], study.mesh, study.chunk
  )
  n, p = tokens.shape[:2]
  rewards = np.stack([score(tokens[i], tmask[i], examples) for i in range(n)])  # [N, P]
  texts = [
    [study.tokenizer.decode(tokens[i, r][tmask[i, r]], skip_special_tokens=True) for r in range(p)]
    for i in range(n)
  ]
  changed = np.array([[texts[i][r] != base["texts"][r] for r in range(p)] for i in range(n)])
  fit = rewards.mean(axis=1)  # [N]
  diff = rewards.mean(axis=0) - base["rewards"]  # [P] members' mean minus base, per problem
  return {
    "fitness_mean": float(fit.mean()),
    "fitness_std": float(fit.std()),
    "fitness_minus_base": float(diff.mean()),
    "fitness_minus_base_se": float(diff.std(ddof=1) / np.sqrt(p)) if p > 1 else 0.0,
    "changed": float(changed.mean()),
    "success_changed": float(((rewards >= 1.0) != (base["rewards"] >= 1.0)[None]).mean()),
  }


def recommend(rows: list[dict], min_changed: float, tolerance: float) -> tuple[float | None, str]:
  """The recommended σ of the module docstring's rule and a sentence saying why."""
  for r in sorted(rows, key=lambda r: r["sigma"]):
    if r["changed"] >= min_changed and r["fitness_minus_base"] >= -tolerance:
      return r["sigma"], (
        f"σ = {r['sigma']:g}: the smallest σ with ≥ {min_changed:.0%} of greedy completions "
        f"changed ({r['changed']:.1%}) and mean fitness within {tolerance:g} of base "
        f"({r['fitness_minus_base']:+.3f})."
      )
  failed = [
    f"σ = {r['sigma']:g}: "
    + ("changed < min" if r["changed"] < min_changed else "fitness below tolerance")
    for r in rows
  ]
  return None, "No σ of the grid meets both rules (" + "; ".join(failed) + ")."


def markdown(rows: list[dict], note: str, config, base_fitness: float, wide=None) -> str:
  d = config.diversity
  head = [
    "σ",
    "σ/RMS(θ)",
    "survives (compute)",
    "survives (bf16)",
    "fitness mean ± SE vs base",
    "fitness std",
    "changed",
    "success changed",
    "JS_succ [95% CI]",
    "JS_pol",
    "Pass@1",
  ]
  lines = eval_results.markdown_header(head)
  for r in rows:
    pol = "–" if r["js_pol"] is None else f"{r['js_pol']:.4f}"
    lines.append(
      eval_results.markdown_row(
        [
          f"{r['sigma']:g}",
          f"{r['relative_sigma']:.4f}",
          f"{r['survives_compute']:.3f}",
          f"{r['survives_bf16']:.3f}",
          f"{r['fitness_mean']:.3f} ({r['fitness_minus_base']:+.3f} "
          f"± {r['fitness_minus_base_se']:.3f})",
          f"{r['fitness_std']:.3f}",
          f"{r['changed']:.3f}",
          f"{r['success_changed']:.3f}",
          eval_results.interval_cell(r["js_succ"], r["js_succ_ci"]),
          pol,
          f"{r['pass@1']:.3f}",
        ]
      )
    )
  return "\n".join(
    [
      "# σ calibration",
      "",
      f"Population of N = {rows[0]['members'] if rows else '?'} around `{config.model.source}` "
      f"{config.model.path or config.model.preset}, es.rank = {config.es.rank}, es.arithmetic = "
      f"{config.es.arithmetic}; the first {d.limit} problems of `{config.data.task}` "
      f"(training pool); greedy fitness with {config.es.max_new_tokens} new tokens (base model "
      f"fitness {base_fitness:.3f}); JS_succ from n = {d.num_samples} samples per member per "
      f"problem at temperature {d.temperature}.",
      "",
      *lines,
      "",
      f"**Recommended:** {note}",
      "",
      f"**Wider σ with JS_succ above zero:** {'none' if wide is None else f'{wide:g}'}.",
      "",
      f"Rule: the smallest σ with changed ≥ {d.min_changed:g} and fitness mean − base ≥ "
      f"−{d.fitness_tolerance:g}; the grid is extended (σ_min/3 or σ_max·3, at most "
      f"{d.extensions} times) until that σ is interior and a larger σ has JS_succ > 0. "
      "'changed': share of (member, problem) greedy completions whose "
      "text differs from the base model's; 'success changed': whose verdict differs. 'survives': "
      "cos(cast(θ+σε) − cast(θ), σε) of member 0 after rounding to the compute dtype / to "
      "bfloat16 (1: the rounded weights carry the perturbation as intended).",
      "",
    ]
  )


def base_answers(source, examples, score, max_new_tokens: int) -> dict[str, Any]:
  """The base model's greedy completions of `examples`: prompts, decoding, rewards and texts."""
  tokenizer = source["tokenizer"]
  ids, mask = run_data.encode_examples(tokenizer, examples)
  greedy = sampling.Decoding(
    max_new_tokens, 0.0, eos_ids=run_data.eos_ids(tokenizer), pad_id=sampling.pad_id(tokenizer)
  )
  out = sampling.generate(
    source["params"],
    ids,
    mask,
    greedy,
    key=source["step_key"],
    config=source["model_config"],
  )
  tokens, tmask = np.asarray(out.tokens), np.asarray(out.mask, bool)
  texts = [
    tokenizer.decode(t[m], skip_special_tokens=True) for t, m in zip(tokens, tmask, strict=True)
  ]
  rewards_ = score(tokens, tmask, examples)
  return {"ids": ids, "mask": mask, "decoding": greedy, "rewards": rewards_, "texts": texts}


def _with_sigma(config, sigma: float) -> ml_collections.ConfigDict:
  sub = ml_collections.ConfigDict(config.to_dict())
  sub.diversity.sigma = sigma
  return sub


def measure_sigma(config, source, params32, base, examples, score, sigma: float, key) -> dict:
  """One σ's row of the table (module docstring); `key` draws the sampled completions."""
  study = diversity.Study(_with_sigma(config, sigma), source)
  spec = study.spec  # the population's noise, as the study samples it
  row = {"sigma": sigma, "members": study.members}
  row.update(greedy_row(study, spec, base, examples, sigma, score))
  sampled = study.measure("es", examples, key)
  row.update({k: sampled[k] for k in ("js_succ", "js_succ_ci", "js_pol", "pass@1", "counts")})
  message = "calibrate σ=%g: changed %.3f fitness %.3f (base %.3f) JS_succ %.4f"
  base_fitness = float(base["rewards"].mean())
  log.info(message, sigma, row["changed"], row["fitness_mean"], base_fitness, row["js_succ"])
  return row


def extension(rows: list[dict], min_changed: float, tolerance: float) -> float | None:
  """The σ to measure next so that the recommended σ is interior (a smaller σ of the grid fails
  the rule, a larger one exists) and a larger σ has JS_succ above zero (its 95% interval's low end
  > 0): σ_min / 3 or σ_max · 3; None when the grid already does, or when no σ can meet the rule
  by extending it (some σ fail on changed answers, the others on fitness)."""
  grid = sorted(r["sigma"] for r in rows)
  sigma, _ = recommend(rows, min_changed, tolerance)
  if sigma is None:
    if all(r["changed"] < min_changed for r in rows):
      return grid[-1] * 3  # every σ too small to change answers
    if all(r["fitness_minus_base"] < -tolerance for r in rows):
      return grid[0] / 3  # every σ breaks the model
    return None
  if sigma == grid[0]:
    return grid[0] / 3
  if sigma == grid[-1] or wide_sigma(rows, sigma) is None:
    return grid[-1] * 3
  return None


def wide_sigma(rows: list[dict], sigma: float) -> float | None:
  """The smallest σ of `rows` above `sigma` whose JS_succ interval excludes zero, else None."""
  above = [r for r in rows if r["sigma"] > sigma and r["js_succ_ci"][0] > 0]
  return min((r["sigma"] for r in above), default=None)


def _partial_rows(path: str, record: dict, restart: bool) -> dict[float, dict]:
  """The σ rows a stopped calibration measured under the same config (`record`); rows of another
  config are refused in one line (diversity.restart=True measures them again)."""
  if restart or not os.path.exists(path):
    return {}
  with open(path) as f:
    saved = json.load(f)
  diff = ["no recorded config"] if not isinstance(saved, dict) else None
  diff = diff or train_loop.config_differences(saved.get("config", {}), record)
  if diff:
    diff = [d.replace("in the checkpoint", "then") for d in diff]
    raise config_check.ConfigError(
      f"{path} holds σ rows measured under another config: {'; '.join(diff[:6])}. Rerun with "
      "the same values, add --config.diversity.restart=True to measure every σ again, or use "
      "a new workdir."
    )
  return {r["sigma"]: r for r in saved["rows"]}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="calibrate"`: the table of the module docstring; returns its path and σ, or
  {"stopped": True} after a SIGTERM (the σ measured so far are kept for the rerun)."""
  config_check.validate(config)
  d = config.diversity
  out_dir = os.path.join(workdir, "calibration")
  partial = os.path.join(out_dir, "rows.partial.json")  # the σ measured before a stop
  record = study_stages.fields(config, "calibration")
  done = _partial_rows(partial, record, bool(d.restart))  # refused before anything is written
  examples = list(run_data.load_examples(config.data, "data", limit=int(d.limit)))  # files first
  reward = run_data.load_reward(config.data, run_data.reward_name(config.data), examples)
  model, tokenizer = model_io.load_model(config.model, seed=config.seed)
  source = dict(model_config=model.config, tokenizer=tokenizer, seed=int(config.seed), es=config.es)
  source = diversity.at_step({**source, "ckpt_dir": None}, models.params(model), 0)
  score = run_data.make_scorer(tokenizer, reward)
  base = base_answers(source, examples, score, int(config.es.max_new_tokens))
  params32 = models.cast_params(source["params"], jnp.float32)
  key = jax.random.fold_in(run_data.run_keys(config.seed)["eval"], 0xCA1)
  os.makedirs(out_dir, exist_ok=True)
  grid, left = [float(s) for s in d.sigmas], int(d.extensions)
  while True:
    for j, sigma in enumerate(grid):  # j keys σ's samples: an extended σ gets a new one
      if sigma not in done:
        if preemption.preempted():  # SIGTERM: a rerun measures the σ not yet in `partial`
          return {"stopped": True}
        key_j = jax.random.fold_in(key, j)
        done[sigma] = measure_sigma(config, source, params32, base, examples, score, sigma, key_j)
        eval_results.write_json(partial, {"config": record, "rows": list(done.values())})
    rows = sorted((done[s] for s in grid), key=lambda r: r["sigma"])
    extra = extension(rows, float(d.min_changed), float(d.fitness_tolerance)) if left else None
    if extra is None:
      break
    log.info("calibrate: extending the σ grid with %g (%d extensions left)", extra, left - 1)
    grid, left = [*grid, extra], left - 1
  dtype = source["model_config"].jnp_dtype
  for row in rows:  # survival is never cached: a rerun over finished σ rebuilds the table
    spec = diversity.Study(_with_sigma(config, row["sigma"]), source).spec
    row.update(survival(params32, dtype, source["step_key"], row["sigma"], spec))
  sigma, note = recommend(rows, float(d.min_changed), float(d.fitness_tolerance))
  wide = None if sigma is None else wide_sigma(rows, sigma)
  base_fitness = float(base["rewards"].mean())
  table = {"recommended_sigma": sigma, "wide_sigma": wide, "note": note}
  table.update(base_fitness=base_fitness, grid=grid, config=record, rows=rows)
  eval_results.write_json(os.path.join(out_dir, "table.json"), table)
  path = os.path.join(out_dir, "table.md")
  eval_results.write_text(path, markdown(rows, note, config, base_fitness, wide))
  print(open(path).read())
  return {"report": path, "recommended_sigma": sigma, "wide_sigma": wide}
