"""ES fine-tuning runner (docs/method.md §1-2): population evaluation on one prompt batch per step,
z-scored fitness, θ ← θ + (α/N) Σ z_i ε_i; checkpoints, resume, logging, final evaluation and
HF export.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/es \
        --config.method=es

One step (global step g = stage offset + local step s):
  step_key = fold_in(keys["noise"], g)                   # member i: fold_in(step_key, i)
  fitness, stats = es_jax.es.population.evaluate_population(
      θ, prompts(g), settings=PopulationSettings(spec, σ, ...), decoding=decoding,
      step_key=step_key, ...)
  θ, opt_state = optax.chain(es_gradient(spec), sgd(α) | adam(α)) applied with the same step_key
                 (or, for es.arithmetic's in-place modes, their residues and update: one
                  UpdateRule.apply either way; α and σ traced: StepSizes)

``spec = noise_spec(config.es)`` is built once per stage and given to both, so the evaluation and
the update cannot disagree on the noise; ``decoding(config.es, ...)`` is the members' decoding.

Resume is exact: the state (params, optimizer state) is checkpointed after the step, and every
input of step g is a function of (seed, g), so a restarted run retraces the uninterrupted one bit
for bit (greedy fitness; sampled fitness too, given the same devices).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from es_jax import metrics, models
from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.es import fitness as fitness_lib
from es_jax.es import gradient as es_lib
from es_jax.es import noise, population, reference_arithmetic
from es_jax.rewards import failure_metrics
from experiments.infra import samples_log
from experiments.runners import run_context, run_data, run_guard, train_loop
from experiments.schema import check as config_check
from experiments.schema import rules as config_rules

log = logging.getLogger(__name__)


def noise_spec(cfg: ml_collections.ConfigDict) -> noise.NoiseSpec:
  """The population's ``noise.NoiseSpec`` from ``config.es``, for evaluation and update alike
  (``config_rules.noise_spec``, the one translation, which validation calls too)."""
  return config_rules.noise_spec(cfg)


def decoding(
  cfg: ml_collections.ConfigDict, eos_ids: tuple[int, ...], pad_id: int, layout=None
) -> sampling.Decoding:
  """The members' ``sampling.Decoding`` from ``config.es`` (max_new_tokens, temperature, top_p)
  and the tokenizer's stop and pad tokens, laid out by `layout` (`run_data.decode_layout`); a bad
  field raises ConfigError prefixed ``config.es:``."""
  with config_check.user_errors("config.es"):
    return run_data.section_decoding(cfg, eos_ids, pad_id, layout)


def population_settings(cfg, spec, model_config, mesh) -> population.PopulationSettings:
  """The population's ``PopulationSettings`` from ``config.es`` (sigma, members_per_chunk,
  share_sample_key), ``spec`` (``noise_spec``), the model and the mesh; a bad field raises
  ConfigError prefixed ``config.es:``."""
  with config_check.user_errors("config.es"):
    return population.PopulationSettings(
      spec,
      float(cfg.sigma),
      model_config,
      int(cfg.members_per_chunk),
      mesh,
      bool(cfg.share_sample_key),
    )


class StepSizes(NamedTuple):
  """The traced sizes of an ES step (float32 scalars: a new value reuses the compiled step)."""

  learning_rate: jax.Array  # α, es.learning_rate
  sigma: jax.Array | None = None  # σ, es.sigma: the in-place modes' restore residues use it


@dataclasses.dataclass(frozen=True)
class UpdateRule:
  """The ES update, as a hashable static argument whose α (and σ) are traced values: changing
  ``es.learning_rate`` does not change the compiled program (a persistent compilation cache is
  hit across a sweep over α).

  Its arithmetic follows ``spec.precision``: ``es_gradient(spec)`` then ``sgd(α)`` or
  ``adam(α)`` (``__call__``), or, for the in-place bf16 modes
  (``reference_arithmetic.MODES``), the members' perturb/restore residues and that code's
  update, rounded as it rounds. ``apply`` is the one step the runner takes either way.

  GRPO wraps its optimizer in ``optax.inject_hyperparams`` for this; here α is passed into the
  jitted step instead, which keeps the optimizer state (and so the checkpoints) as they were:
  sgd's and adam's states do not depend on the learning rate.
  """

  spec: noise.NoiseSpec
  shaping: Any  # a name in es_jax.es.fitness.SHAPINGS, or a callable
  sharded: bool
  optimizer: str  # "sgd" | "adam"

  def __call__(self, learning_rate: float | jax.Array) -> optax.GradientTransformationExtraArgs:
    grad = es_lib.es_gradient(self.spec, shaping=self.shaping, sharded=self.sharded)
    step = optax.sgd if self.optimizer == "sgd" else optax.adam
    return optax.chain(grad, step(learning_rate))

  def apply(self, state: dict[str, Any], fitness, step_key, sizes: StepSizes):
    """One update of ``state`` (params, optimizer state) from the population's fitness; returns
    (the updated state, ‖Δθ‖/‖θ‖ of the step: ``run_guard.relative_norm`` / ``relative_change``)."""
    params = state["params"]
    if self.spec.precision in reference_arithmetic.MODES:
      return self._in_place(params, fitness, step_key, sizes, state)
    updates, opt_state = self(sizes.learning_rate).update(
      params, state["opt_state"], params, fitness=fitness, key=step_key
    )
    ratio = run_guard.relative_norm(updates, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt_state}, ratio

  def _in_place(self, old, fitness, step_key, sizes: StepSizes, state):
    """The in-place modes: the members' residues, then that code's update (module
    ``es_jax.es.reference_arithmetic``); the optimizer state is kept as it is."""
    n, mode = fitness.shape[0], self.spec.precision
    params = reference_arithmetic.residue(
      old, step_key, n, sizes.sigma, mode=mode, sharded=self.sharded
    )
    weights = fitness_lib.shape_fitness(
      fitness, population_size=n, shaping=self.shaping, key=step_key
    )
    params = reference_arithmetic.update(
      params, step_key, weights, sizes.learning_rate, mode=mode, sharded=self.sharded
    )
    return {**state, "params": params}, run_guard.relative_change(params, old)


def make_update_rule(
  cfg: ml_collections.ConfigDict,
  *,
  sharded: bool = False,
  spec: noise.NoiseSpec | None = None,
) -> UpdateRule:
  """The ``UpdateRule`` of ``config.es`` (a validated config).

  Args:
    cfg: ``config.es``.
    sharded: the weights are split over the mesh's 'model' axis (``es_gradient(sharded=)``).
    spec: the population's noise spec, the one its evaluation uses; None builds
      ``noise_spec(cfg)``.
  """
  spec = noise_spec(cfg) if spec is None else spec
  return UpdateRule(spec, cfg.shaping, bool(sharded), cfg.optimizer)


def master_weights(params, master_dtype: str, compute_dtype) -> Any:
  """The weights ES updates, in `es.master_dtype`: float32 masters ("float32"), or the model's
  own compute dtype ("": `UpdateRule.apply` rounds the update to it once, or, in es.arithmetic's
  in-place modes, as those codes do)."""
  return models.cast_params(params, jnp.dtype(master_dtype) if master_dtype else compute_dtype)


@functools.partial(jax.jit, static_argnames=("rule",), donate_argnums=(0,))
def _apply(state: dict[str, Any], fitness, step_key, sizes: StepSizes, *, rule: UpdateRule):
  """`rule.apply`, jitted: (the updated state, ‖Δθ‖/‖θ‖ of the update)."""
  return rule.apply(state, fitness, step_key, sizes)


def step_metrics(fitness: np.ndarray, stats: population.PopulationStats) -> dict[str, Any]:
  """Fitness statistics, per-member rewards, length, entropy and success diversity of a step."""
  success = (np.nan_to_num(stats.rewards, nan=0.0) >= 1.0).astype(np.float32)  # [N, P]
  mean = float(np.nanmean(fitness))
  return {
    "train/reward": mean,  # the name ES and GRPO share (GRPO: reward/mean)
    "fitness/mean": mean,
    "fitness/std": float(np.nanstd(fitness)),
    "fitness/max": float(np.nanmax(fitness)),
    "fitness/min": float(np.nanmin(fitness)),
    "fitness/per_member": fitness,
    "length/mean": float(np.nanmean(stats.mean_length)),
    "entropy/mean": float(np.nanmean(stats.mean_entropy)),
    # Greedy: p_i(x) ∈ {0, 1}; sampled: one draw. JS_succ averaged over prompts (docs/method.md §6).
    "diversity/js_success": float(metrics.js_success_diversity(success)),
    "success/union": float(success.max(axis=0).mean()),
  }


def train(ctx: run_context.Context, params, stage: train_loop.Stage) -> train_loop.StageResult:
  """Runs (or resumes) one ES stage from `params`; returns the final params."""
  cfg = ctx.config.es  # validated by run (experiments.schema.check)
  spec = noise_spec(cfg)  # one spec for the evaluation and the update
  layout = run_data.decode_layout(ctx.config)
  members_decoding = decoding(cfg, ctx.eos_ids, ctx.pad_id, layout)
  rule = make_update_rule(cfg, sharded=ctx.mesh.shape["model"] > 1, spec=spec)
  # Traced: a new α or σ reuses the compiled step.
  sizes = StepSizes(jnp.float32(cfg.learning_rate), jnp.float32(cfg.sigma))
  members_settings = population_settings(cfg, spec, ctx.model_config, ctx.mesh)
  params = jax.tree.map(jnp.copy, params)  # the step donates the state; keep the caller's arrays
  params = master_weights(params, cfg.master_dtype, ctx.model_config.jnp_dtype)
  # Placed once (large matrices split over 'model' when it is > 1): the update keeps the layout.
  params = sharding.place_params(params, ctx.mesh)
  log.info(
    "ES: members run in %s, weights and updates in %s (es.arithmetic=%s)",
    ctx.model_config.dtype,
    jax.tree.leaves(params)[0].dtype,
    cfg.arithmetic,
  )
  # The optimizer state placed as well: an unplaced step count would compile the update twice
  # (the first step's output comes back placed).
  opt_state = sharding.place_params(rule(sizes.learning_rate).init(params), ctx.mesh)
  state = {"params": params, "opt_state": opt_state}
  loop = train_loop.Loop(ctx, stage, state)
  state = loop.state
  for step in loop.steps():
    g = stage.offset + step - 1  # the global index of this step's inputs
    step_key = jax.random.fold_in(ctx.keys["noise"], g)
    examples, ids, mask = run_data.step_batch(ctx, g)
    # The config's errors were raised before the loop (noise_spec, decoding, make_update_rule,
    # the population settings, run_context's mesh check); one raised here is a bug or bad data,
    # reported as itself.
    fitness, stats = population.evaluate_population(
      state["params"],
      ids,
      mask,
      settings=members_settings,
      decoding=members_decoding,
      step_key=step_key,
      score_fn=lambda t, m, ex=examples: ctx.score(t, m, ex),
      sample_key=jax.random.fold_in(ctx.keys["sample"], g),
    )
    loop.check_rewards(step, stats.rewards)  # none finite: stop before the update
    shaped = fitness_lib.shaping_input(cfg.shaping, fitness, stats.rewards)
    state, ratio = _apply(state, shaped, step_key, sizes, rule=rule)
    values = step_metrics(fitness, stats)
    values[run_guard.UPDATE_RATIO] = float(ratio)  # checked by end_step (max_update_ratio)
    # Non-finite rewards rank worst in the shaping (es_jax.es.fitness); count them.
    values["reward/non_finite"] = int(np.sum(~np.isfinite(stats.rewards)))
    values.update(failure_metrics())  # checks scored 0 on a timeout or crash
    # Every host's members (stats.completions holds this host's only): mean length x prompts.
    n_tokens = float(np.sum(stats.mean_length, dtype=np.float64)) * ids.shape[0]
    values["tokens_per_second"] = n_tokens / max(loop.step_seconds(), 1e-9)
    loop.log_samples(
      step, functools.partial(samples_log.es_rows, ctx.tokenizer, examples, fitness, stats)
    )
    loop.end_step(step, state, values, params=state["params"])
  return loop.result(state["params"])


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """An ES run: `config.es.num_steps` steps from the base model, then evaluation and export."""
  config_check.validate(config)
  return train_loop.run_single(config, workdir, "es", train)
