"""Diversity study (docs/method.md §6): how differently the members of an ES population succeed.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/diversity \
        --config.method=diversity --config.diversity.run=runs/demo/es

For the population θ + σ ε_i, i < N, with ε_i the noise of a step key, every member samples n
responses per held-out problem (config.eval's task, `diversity.limit` problems) at
`diversity.temperature`; the task's verifier scores them. From the counts c_i(x):

  JS_succ(x)  = h(p̄) − (1/N) Σ_i h(p_i),  p_i = c_i / n, bias-corrected
                (`es_jax.metrics.js_success_from_counts`), mean over problems with a bootstrap CI
  union       1 − Π_i (1 − p_i) (one sample per member) vs a single policy's 1 − (1 − p̄)^N, and
              the observed rate at which draw j of some member succeeds (unbiased for the former)
  JS_pol(x)   = H(π̄) − (1/N) Σ H(π_i) on the first `pol_prompts` problems: `pol_samples`
                completions per member scored by every member's log-likelihood at the temperature

The same numbers for a GRPO-style group (N x n samples of the centre policy θ: one policy,
expected ≈ 0) and a control (the ES machinery at σ = 0, expected ≈ 0).

The model: `diversity.run` (an ES run directory: its seed, model and es settings, its checkpoint
`diversity.step`, newest by default), else config.model (source orbax: that checkpoint) with
config.es. The step key defaults to the run's own for the population around these params:
fold_in(run_keys(seed)["noise"], g) with g the checkpoint's global step (0 for a base model),
the population the run evaluates at its next step. Writes workdir/diversity/{table.md,table.json}
(the tables: experiments.studies.diversity_tables).

`diversity.checkpoints=True`: the study at every checkpoint of the run, each population around that
checkpoint's params with its own step key; by_checkpoint.{md,json} and two PNGs give JS_succ per
checkpoint beside the centre policy's Pass@1 and Pass@n gain over the first checkpoint (n =
diversity.num_samples, from the group rows' N x n samples of θ); table.* is the newest one's.
The population is split over the mesh's 'pop' axis (config.mesh) as in training, so a paper-scale
population runs on the slice that trained it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from es_jax import metrics, models, rewards
from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.es import members, noise, population
from es_jax.grpo import loss as grpo
from es_jax.models.transformer import forward, positions_from_mask
from es_jax.persist.checkpoint import Checkpointer
from experiments.configs.choices import DIVERSITY_KINDS
from experiments.evaluation import data as eval_data
from experiments.evaluation import results as eval_results
from experiments.runners import model_io, run_context, run_data
from experiments.schema import check as config_check
from experiments.studies import diversity_tables, sparsity

log = logging.getLogger(__name__)


def _restore(ckpt_dir: str, step: int) -> tuple[Any, int]:
  """(params, global step) of a run's checkpoint (`step` -1: the newest)."""
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    restored = ckpt.restore(None if step < 0 else step)
  finally:
    ckpt.close()
  state, meta = restored.state, restored.meta
  params = state["params"] if isinstance(state, dict) and "params" in state else state
  position, per_step = meta.get("data_position"), meta.get("config", {}).get("data", {})
  per_step = per_step.get("prompts_per_step") if isinstance(per_step, dict) else None
  g = position // per_step if position is not None and per_step else int(meta["step"])
  return jax.tree.map(jnp.asarray, params), int(g)


def load_population_source(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The params, model, tokenizer, seed, ES settings and global step the study is about.

  With `diversity.checkpoints` and a checkpoint directory, no params yet: `run` restores each
  checkpoint in turn (`at_step`)."""
  d = config.diversity
  seed, model_cfg, es_cfg = config.seed, config.model, config.es
  if d.run:
    path = os.path.join(d.run, "config.json")
    config_check.check(
      os.path.exists(path), "diversity.run", d.run, "need a run dir with config.json"
    )
    with open(path) as f:
      saved = ml_collections.ConfigDict(json.load(f))
    seed, model_cfg, es_cfg = saved.seed, saved.model, saved.es
  ckpt_dir = None
  if d.run or model_cfg.source == "orbax":
    ckpt_dir = sparsity.checkpoint_dir_of(d.run) if d.run else model_cfg.path
    # A run's config.model is its base model; an orbax source names its base in base_*.
    base = dict(model_cfg)
    if not d.run:
      base.update(source=model_cfg.base_source or "default", path=model_cfg.base_path)
    model, tokenizer = model_io.load_model(base, seed=seed)
    params, g = (None, None) if d.checkpoints else _restore(ckpt_dir, int(d.step))
  else:
    model, tokenizer = model_io.load_model(model_cfg, seed=seed)
    params, g = models.params(model), 0
  source = dict(
    model_config=model.config, tokenizer=tokenizer, seed=int(seed), es=es_cfg, ckpt_dir=ckpt_dir
  )
  return source if params is None else at_step(source, params, g, int(d.key_step))


def at_step(source: dict[str, Any], params: Any, g: int, key_step: int = -1) -> dict[str, Any]:
  """`source` with the params of global step `g` and the step key of `key_step` (-1: `g`)."""
  g_key = g if key_step < 0 else key_step
  return {
    **source,
    "params": params,
    "global_step": g_key,
    "step_key": jax.random.fold_in(run_data.run_keys(source["seed"])["noise"], g_key),
  }


def checkpoint_steps(ckpt_dir: str) -> list[int]:
  """The checkpoint steps saved in `ckpt_dir`, oldest first."""
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    return sorted(ckpt.all_steps())
  finally:
    ckpt.close()


@functools.partial(jax.jit, static_argnames=("config", "spec", "completion_length"))
def _member_loglik(
  params,
  step_key,
  i,
  sigma,
  temperature,
  tokens,
  mask,
  *,
  config,
  spec,
  completion_length,
):
  """[B] log π_i(completion | prompt) at `temperature` for member i of the population `spec`."""
  params_i, deltas, scale = members.member(params, step_key, i, sigma, spec)

  def apply(p, t, m):
    logits, _ = forward(
      p, t, positions_from_mask(m), config=config, mask=m, deltas=deltas, delta_scale=scale
    )
    return logits

  logp, _ = grpo.token_logprobs(apply, params_i, tokens, mask, temperature=temperature)
  done = mask[:, -completion_length:]
  return jnp.sum(jnp.where(done, logp[:, -completion_length:], 0.0), axis=-1)


class Study:
  """Samples, scores and measures one population kind (module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, source: dict[str, Any]):
    # A validated config (config_check): the counts are >= 1, σ and the temperature > 0 (es
    # may be a finished run's, validated when it ran).
    d, es = config.diversity, source["es"]
    self.n = int(d.num_samples)
    self.members = int(d.population_size or es.population_size)
    self.sigma = float(d.sigma or es.sigma)
    self.temperature = float(d.temperature)
    # The population is split over the mesh's 'pop' axis as in training
    # (experiments.runners.es_runner).
    self.mesh = run_context.make_mesh(config)
    pop = self.mesh.shape["pop"]
    config_check.check(
      self.members % pop == 0,
      "diversity.population_size",
      self.members,
      f"need a multiple of the mesh's pop axis ({pop}; config.mesh.pop)",
    )
    chunk = int(es.members_per_chunk)
    self.chunk = chunk if self.members % (pop * chunk) == 0 else 1
    try:  # the sampled population's noise (its log-likelihoods use the same fields)
      self.spec = noise.NoiseSpec(
        self.members,
        antithetic=bool(es.antithetic),
        rank=int(es.rank) or None,
        low_rank_vectors=es.low_rank_vectors,
      )
    except ValueError as e:
      raise ValueError(f"config.diversity (population of es + diversity): {e}") from None
    self.source = {**source, "params": sharding.place_params(source["params"], self.mesh)}
    self.config = config
    self.tokenizer, self.task = source["tokenizer"], config.eval.task
    self.decoding = sampling.Decoding(
      int(config.eval.max_new_tokens),
      self.temperature,
      eos_ids=run_data.eos_ids(self.tokenizer),
      pad_id=sampling.pad_id(self.tokenizer),
      **run_data.decode_layout(config),
    )

  def completions(self, kind: str, ids: np.ndarray, mask: np.ndarray, key: jax.Array):
    """tokens and mask [N, R, T] of every member on prompt rows ids/mask [R, S]."""
    src = self.source
    if kind == "group":  # one policy: N x R rows of θ, split into N pseudo-members
      out = sampling.generate(
        src["params"],
        np.tile(ids, (self.members, 1)),
        np.tile(mask, (self.members, 1)),
        self.decoding,
        key=key,
        config=src["model_config"],
      )
      shape = (self.members, ids.shape[0], -1)
      return np.asarray(out.tokens).reshape(shape), np.asarray(out.mask).reshape(shape)
    settings = population.PopulationSettings(
      self.spec, self.sigma, src["model_config"], self.chunk, self.mesh
    )
    # σ as a float32 leaf; 0 (the sampled kind: N copies of θ) set by tree.map, which does not
    # validate (a population's σ must be > 0).
    sigma = jnp.float32(self.sigma if kind == "es" else 0.0)
    out = population.population_completions(
      src["params"],
      jnp.asarray(ids),
      jnp.asarray(mask),
      src["step_key"],
      key,
      self.decoding.as_float32(),
      jax.tree.map(lambda _: sigma, settings),
    )  # members split over 'pop'; several hosts: JS_pol scores every member's tokens everywhere
    return tuple(np.asarray(x) for x in sharding.fetch((out.tokens, out.mask)))

  def correct(self, tokens, mask, examples) -> np.ndarray:
    """[N, R] bool: the eval task's verifier on each member's decoded completions."""
    out = np.zeros(tokens.shape[:2], bool)
    for i in range(tokens.shape[0]):
      for r, ex in enumerate(examples):
        text = self.tokenizer.decode(tokens[i, r][mask[i, r]], skip_special_tokens=True)
        out[i, r] = rewards.is_correct(text, ex, task=self.task)
    return out

  def js_policy(self, kind: str, ids, mask, tokens, comp_mask) -> np.ndarray:
    """[P'] JS_pol from tokens [N, P', S, T]: ll[i, j, s] = log π_i(y_js), every i scoring."""
    n_members, p, s, t = tokens.shape
    full = np.concatenate(
      [
        np.repeat(np.repeat(ids[None], n_members, 0), s, 1).reshape(-1, ids.shape[-1]),
        tokens.transpose(1, 0, 2, 3).reshape(-1, t),
      ],
      axis=1,
    )
    full_mask = np.concatenate(
      [
        np.repeat(np.repeat(mask[None], n_members, 0), s, 1).reshape(-1, mask.shape[-1]),
        comp_mask.transpose(1, 0, 2, 3).reshape(-1, t),
      ],
      axis=1,
    )
    # The group's policy θ is the population at σ = 0 (one compiled scorer for every kind).
    sigma = self.sigma if kind == "es" else 0.0
    ll = [
      np.asarray(
        _member_loglik(
          self.source["params"],
          self.source["step_key"],
          jnp.int32(i),
          jnp.float32(sigma),
          jnp.float32(self.temperature),
          jnp.asarray(full),
          jnp.asarray(full_mask),
          config=self.source["model_config"],
          spec=self.spec,
          completion_length=t,
        )
      )
      for i in range(n_members)
    ]
    ll = np.stack(ll).reshape(n_members, p, n_members, s).transpose(1, 0, 2, 3)  # [P', i, j, s]
    return np.asarray(metrics.js_policy_diversity(ll), np.float64)

  def measure(self, kind: str, examples: list[dict], key: jax.Array) -> dict[str, Any]:
    """Counts, JS_succ, union and JS_pol of population `kind` on `examples`."""
    d = self.config.diversity
    per_call = int(d.prompts_per_call)
    pol_prompts = min(int(d.pol_prompts), len(examples))
    pol_samples = min(int(d.pol_samples), self.n)
    counts, first_draw, pol = [], [], []
    all_ids, all_mask = run_data.encode_examples(self.tokenizer, examples)  # one prompt length
    per_call = min(per_call, len(examples))
    for b, start in enumerate(range(0, len(examples), per_call)):
      block = examples[start : start + per_call]
      # The last block is padded with its last prompt (results dropped): one compiled shape.
      rows = np.minimum(np.arange(start, start + per_call), len(examples) - 1)
      ids, mask = all_ids[rows], all_mask[rows]
      block = block + [block[-1]] * (per_call - len(block))
      real = min(per_call, len(examples) - start)
      ids_rep, mask_rep = np.repeat(ids, self.n, 0), np.repeat(mask, self.n, 0)  # row p·n + j
      tokens, comp_mask = self.completions(kind, ids_rep, mask_rep, jax.random.fold_in(key, b))
      rep = [ex for ex in block for _ in range(self.n)]
      ok = self.correct(tokens, comp_mask, rep).reshape(self.members, len(block), self.n)
      ok = ok[:, :real]
      counts.append(ok.sum(-1))
      first_draw.append(ok.any(axis=0).mean(axis=-1))  # [P]: draw j of some member succeeds
      take = min(pol_prompts - start, real)
      if take > 0 and pol_samples > 0:
        shape = (self.members, len(block), self.n, -1)
        pol.append(
          self.js_policy(
            kind,
            ids[:take],
            mask[:take],
            tokens.reshape(shape)[:, :take, :pol_samples],
            comp_mask.reshape(shape)[:, :take, :pol_samples],
          )
        )
    c = np.concatenate(counts, axis=1)  # [N, P]
    p_hat = c / self.n
    js = metrics.js_success_from_counts(c, self.n, correction=d.correction)
    ci = metrics.bootstrap_ci(js, num_resamples=int(d.bootstrap), seed=int(self.config.seed))
    union = metrics.success_union(p_hat)
    return {
      "kind": kind,
      "label": DIVERSITY_KINDS[kind],
      "members": self.members,
      "samples": self.n,
      "problems": int(c.shape[1]),
      "sigma": self.sigma if kind == "es" else 0.0,
      "pass@1": float(p_hat.mean()),
      "member_pass@1": [float(v) for v in p_hat.mean(axis=1)],
      "js_succ": ci.mean,
      "js_succ_ci": [ci.low, ci.high],
      "js_succ_plugin": float(metrics.js_success_diversity(p_hat)),
      "union_population": float(np.mean(union.population)),
      "union_single_policy": float(np.mean(union.mean_policy)),
      "union_observed": float(np.mean(np.concatenate(first_draw))),
      "js_pol": float(np.mean(np.concatenate(pol))) if pol else None,
      "js_pol_prompts": pol_prompts if pol else 0,
      "counts": c.tolist(),
    }


def _measure_all(study: Study, kinds, examples, key) -> list[dict[str, Any]]:
  rows = []
  for i, kind in enumerate(kinds):
    row = study.measure(kind, examples, jax.random.fold_in(key, i))
    step = study.source["global_step"]
    message = "diversity %s at step %d: JS_succ %.4f pass@1 %.3f"
    log.info(message, kind, step, row["js_succ"], row["pass@1"])
    rows.append(row)
  return rows


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """`method="diversity"`: the study of the module docstring; returns {"report": table.md}."""
  config_check.validate(config)  # kinds, correction and limit among them
  d = config.diversity
  kinds = [k.strip() for k in str(d.kinds).split(",") if k.strip()]
  # The first diversity.limit evaluation problems, disjoint from the training pool as every
  # evaluation's are (experiments.evaluation.data), checked before the population loads.
  heldout = eval_data.training_set(config)
  examples, _ = heldout.load(config.eval.to_dict(), "eval", limit=int(d.limit))
  examples = list(examples)
  source = load_population_source(config)
  key = jax.random.fold_in(run_data.run_keys(config.seed)["eval"], 0x5D1)
  out = os.path.join(workdir, "diversity")  # several hosts: each measures, process 0 writes
  os.makedirs(out, exist_ok=True)
  if d.checkpoints:  # with diversity.run or an orbax model (config_rules)
    by_step = []
    for step in checkpoint_steps(source["ckpt_dir"]):
      params, g = _restore(source["ckpt_dir"], step)
      source = at_step(source, params, g)  # each checkpoint with its own step key
      rows = _measure_all(Study(config, source), kinds, examples, key)
      by_step.append({"checkpoint": step, "global_step": g, "rows": rows})
    if sharding.is_primary():
      diversity_tables.write_by_checkpoint(out, by_step, int(d.num_samples))
  else:
    rows = _measure_all(Study(config, source), kinds, examples, key)
  path = os.path.join(out, "table.md")
  if not sharding.is_primary():
    return {"report": path, "diversity": {r["kind"]: r["js_succ"] for r in rows}}
  eval_results.write_json(
    os.path.join(out, "table.json"),
    {
      "global_step": source["global_step"],
      "seed": source["seed"],
      "run": d.run,
      "task": config.eval.task,
      "temperature": float(d.temperature),
      "rows": rows,
    },
  )
  eval_results.write_text(path, diversity_tables.markdown(rows, source, config))
  return {"report": path, "diversity": {r["kind"]: r["js_succ"] for r in rows}}
