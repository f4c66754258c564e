"""GRPO fine-tuning run (docs/method.md §3): G sampled completions per prompt, group advantages,
clipped policy-gradient steps with a k3 KL to the base model; checkpoints, resume, logging,
evaluation.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/grpo \
        --config.method=grpo

One step (global step g = stage offset + local step s): sample G completions per prompt of
batch(g) with key fold_in(keys["sample"], g); reward them on the host; `with_advantages`; then
`es_jax.grpo_train.update_step` takes B / mini_batch_size optimizer steps on the rollout. The
checkpoint holds the whole `GRPOState` (params, AdamW state, optimizer step count); since every
input of step g is a function of (seed, g), a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import grpo_train, sharding
from es_jax.rewards import failure_metrics
from experiments import config_check, run_context, run_data, samples_log, train_loop
from experiments.configs.choices import GRPO_ADVANTAGE_STD

log = logging.getLogger(__name__)


def make_optimizer(cfg: ml_collections.ConfigDict):
  config_check.validate_section(cfg, "grpo")  # also called without a validated config
  try:
    return grpo_train.make_optimizer(
      float(cfg.learning_rate),
      weight_decay=float(cfg.weight_decay),
      max_grad_norm=float(cfg.max_grad_norm),
    )
  except ValueError as e:
    raise ValueError(f"config.grpo: {e}") from None


def train(
  ctx: run_context.Context, params, stage: train_loop.Stage, ref_params=None
) -> train_loop.StageResult:
  """Runs (or resumes) one GRPO stage from `params`; returns the final params.

  `ref_params` is the KL reference π_ref (default: the base model, ctx.base_params).
  """
  cfg = ctx.config.grpo  # validated by make_context (experiments.config_check)
  group, micro = int(cfg.num_generations), int(cfg.micro_batch_size)
  mini = int(cfg.mini_batch_size) or int(ctx.config.data.prompts_per_step) * group
  optimizer = make_optimizer(cfg)
  master = cfg.master_dtype
  state = grpo_train.init_state(params, optimizer, mesh=ctx.mesh, master_dtype=master or None)
  log.info(
    "GRPO: forward/backward in %s, master weights and AdamW state in %s",
    ctx.model_config.dtype,
    jax.tree.leaves(state.params)[0].dtype,
  )
  if ref_params is None:
    ref_params = ctx.base_params
  ref_params = ref_params if float(cfg.beta) > 0 else None
  loop = train_loop.Loop(ctx, stage, state)
  state = loop.state
  for step in loop.steps():
    g = stage.offset + step - 1
    examples, ids, mask = run_data.step_batch(ctx, g)
    try:
      completions, batch = grpo_train.rollout(
        state.params,
        ids,
        mask,
        config=ctx.model_config,
        key=jax.random.fold_in(ctx.keys["sample"], g),
        num_generations=group,
        max_new_tokens=int(cfg.max_new_tokens),
        temperature=float(cfg.temperature),
        top_p=None if cfg.top_p >= 1.0 else float(cfg.top_p),
        eos_ids=ctx.eos_ids,
        pad_id=ctx.pad_id,
        mesh=ctx.mesh,
      )
      # Each host decodes and scores the rows on its own devices; only rewards cross hosts.
      rows, host = train_loop.local_completions(completions)
      rows_examples = [examples[r // group] for r in rows]
      local_rewards = ctx.score(host.tokens, host.mask, rows_examples)
      num_rows = len(examples) * group
      rewards = sharding.gather_rows(rows, local_rewards, num_rows).reshape(len(examples), group)
      new_tokens = float(sharding.gather_rows(rows, host.lengths, num_rows).sum())
      batch, adv_stats = grpo_train.with_advantages(
        batch, rewards, std=GRPO_ADVANTAGE_STD[cfg.advantage_std]
      )
      state, update = grpo_train.update_step(
        state,
        batch,
        ref_params,
        config=ctx.model_config,
        optimizer=optimizer,
        mini_batch_size=mini,
        micro_batch_size=micro,
        eps_low=float(cfg.eps_low),
        eps_high=float(cfg.eps_high),
        beta=float(cfg.beta),
        aggregation=cfg.aggregation,
        remat=bool(cfg.remat),
        mesh=ctx.mesh,
      )
    except ValueError as e:
      raise ValueError(f"config.grpo: {e}") from None
    values: dict[str, Any] = {
      "train/reward": float(rewards.mean()),  # the name ES and GRPO share (ES: fitness/mean)
      "reward/mean": float(rewards.mean()),
      "reward/std": float(rewards.std()),
      "reward/per_prompt": rewards.mean(axis=1),
      "reward/frac_groups_all_equal": float(np.mean(rewards.max(1) == rewards.min(1))),
      # Non-finite rewards rank worst in their group (es_jax.grpo.group_advantages); count them.
      "reward/non_finite": int(np.sum(~np.isfinite(rewards))),
    }
    values.update(failure_metrics())  # checks scored 0 on a timeout or crash
    rollout = jax.device_get(grpo_train.rollout_stats(completions))
    values.update({f"rollout/{k.removeprefix('rollout_')}": float(v) for k, v in rollout.items()})
    values["entropy/mean"] = values.pop("rollout/entropy")
    values["length/mean"] = values.pop("rollout/response_length")
    values.update({f"adv/{k}": float(np.mean(v)) for k, v in jax.device_get(adv_stats).items()})
    values.update({f"grpo/{k}": float(np.mean(v)) for k, v in jax.device_get(update).items()})
    values["tokens_per_second"] = new_tokens / max(loop.step_seconds(), 1e-9)
    if jax.process_count() == 1:  # several hosts: `host` holds this host's rows only
      std = GRPO_ADVANTAGE_STD[cfg.advantage_std]
      rows = functools.partial(
        samples_log.grpo_rows, ctx.tokenizer, examples, host, rewards, std=std
      )
      loop.log_samples(step, rows)
    loop.end_step(step, state, values, params=state.params)
  finished = loop.close()
  return train_loop.StageResult(state.params, finished)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """A GRPO run: `config.grpo.num_steps` steps from the base model, then evaluation and export."""
  return train_loop.run_single(config, workdir, "grpo", train)
