"""GRPO fine-tuning runner (docs/method.md §3): G sampled completions per prompt, group
advantages, clipped policy-gradient steps with a k3 KL to the base model; checkpoints, resume,
logging, evaluation.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/grpo \
        --config.method=grpo

One step (global step g = stage offset + local step s): sample G completions per prompt of
batch(g) with key fold_in(keys["sample"], g); reward them on the host; `with_advantages`; then
`es_jax.grpo.update.update_step` takes B / mini_batch_size optimizer steps on the rollout. The
checkpoint holds the whole `GRPOState` (params, AdamW state, optimizer step count); since every
input of step g is a function of (seed, g), a resumed run repeats the uninterrupted one.

The config's values become the optimizer, the rollout's `Decoding` and the step's
`UpdateSettings` (with its `LossSettings`) before the first step, their errors naming the field
(``config.grpo.eps_low``); an error raised inside a step is reported as itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax.decode import sampling
from es_jax.devices import sharding
from es_jax.grpo import update as grpo_update
from es_jax.rewards import failure_metrics
from experiments.configs.choices import GRPO_ADVANTAGE_STD
from experiments.infra import samples_log
from experiments.runners import run_context, run_data, run_guard, train_loop
from experiments.schema import check as config_check

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _grpo_fields(owner: str):
  """ValueErrors of `owner`'s checks ("Owner.field=... must ..."; "" for no owner, "field=...")
  as ConfigErrors naming config.grpo.field; any other ValueError prefixed "config.grpo: "."""
  prefix = f"{owner}." if owner else ""
  try:
    yield
  except ValueError as e:
    text = str(e)
    if text.startswith(prefix):
      raise config_check.ConfigError("config.grpo." + text.removeprefix(prefix)) from e
    raise config_check.ConfigError(f"config.grpo: {text}") from e


def make_optimizer(cfg: ml_collections.ConfigDict):
  """The clipped AdamW of ``config.grpo`` (learning_rate, weight_decay, max_grad_norm)."""
  with _grpo_fields(""):
    return grpo_update.make_optimizer(
      float(cfg.learning_rate),
      weight_decay=float(cfg.weight_decay),
      max_grad_norm=float(cfg.max_grad_norm),
    )


def decoding(
  cfg: ml_collections.ConfigDict, eos_ids: tuple[int, ...], pad_id: int, layout=None
) -> sampling.Decoding:
  """The rollout's ``sampling.Decoding`` from ``config.grpo`` (max_new_tokens, temperature,
  top_p) and the tokenizer's stop and pad tokens, laid out by `layout`
  (`run_data.decode_layout`)."""
  with _grpo_fields("Decoding"):
    return run_data.section_decoding(cfg, eos_ids, pad_id, layout)


def update_settings(
  config: ml_collections.ConfigDict, devices: int = 1
) -> grpo_update.UpdateSettings:
  """The update step's ``UpdateSettings`` from ``config.grpo`` for `devices` on the mesh's 'pop'
  axis; grpo.mini_batch_size 0 is the whole rollout (data.prompts_per_step × num_generations)."""
  cfg = config.grpo
  rows = int(config.data.prompts_per_step) * int(cfg.num_generations)
  mini = int(cfg.mini_batch_size) or rows
  with _grpo_fields("LossSettings"):
    loss = grpo_update.LossSettings(
      float(cfg.eps_low), float(cfg.eps_high), float(cfg.beta), cfg.aggregation
    )
  with _grpo_fields("UpdateSettings"):
    settings = grpo_update.UpdateSettings(
      mini, int(cfg.micro_batch_size), loss, remat=bool(cfg.remat)
    )
  config_check.check(
    mini % (settings.micro_batch_size * devices) == 0,
    "grpo.micro_batch_size",
    cfg.micro_batch_size,
    f"micro_batch_size x {devices} 'pop' devices must divide the {mini} rows of a mini-batch "
    "(grpo.mini_batch_size; 0 = the whole rollout)",
  )
  return settings


def train(
  ctx: run_context.Context, params, stage: train_loop.Stage, ref_params=None
) -> train_loop.StageResult:
  """Runs (or resumes) one GRPO stage from `params`; returns the final params.

  `ref_params` is the KL reference π_ref (default: the base model, ctx.base_params).
  """
  cfg = ctx.config.grpo  # validated by run (experiments.schema.check)
  group, std = int(cfg.num_generations), GRPO_ADVANTAGE_STD[cfg.advantage_std]
  optimizer = make_optimizer(cfg)
  settings = update_settings(ctx.config, devices=int(ctx.mesh.shape["pop"]))
  layout = run_data.decode_layout(ctx.config)
  rollout_decoding = decoding(cfg, ctx.eos_ids, ctx.pad_id, layout)
  master = cfg.master_dtype
  state = grpo_update.init_state(params, optimizer, mesh=ctx.mesh, master_dtype=master or None)
  log.info(
    "GRPO: forward/backward in %s, master weights and AdamW state in %s",
    ctx.model_config.dtype,
    jax.tree.leaves(state.params)[0].dtype,
  )
  if ref_params is None:
    ref_params = ctx.base_params
  ref_params = ref_params if settings.loss.beta > 0 else None
  loop = train_loop.Loop(ctx, stage, state)
  state = loop.state
  for step in loop.steps():
    g = stage.offset + step - 1
    examples, ids, mask = run_data.step_batch(ctx, g)
    completions, batch = grpo_update.rollout(
      state.params,
      ids,
      mask,
      config=ctx.model_config,
      key=jax.random.fold_in(ctx.keys["sample"], g),
      num_generations=group,
      decoding=rollout_decoding,
      mesh=ctx.mesh,
    )
    host, rewards, new_tokens = _score_rollout(ctx, completions, examples, group)
    loop.check_rewards(step, rewards)  # none finite: stop before the update
    batch, adv_stats = grpo_update.with_advantages(batch, rewards, std=std)
    # A checkpoint still being written holds the state's buffers, and the step could not update
    # them in place (donation): it would hold a second state (1.6 GB for SmolLM2-135M).
    loop.ckpt.wait()
    state, update = grpo_update.update_step(
      state,
      batch,
      ref_params,
      settings,
      config=ctx.model_config,
      optimizer=optimizer,
      mesh=ctx.mesh,
    )
    values = step_metrics(rewards, completions, adv_stats, update)
    values["tokens_per_second"] = new_tokens / max(loop.step_seconds(), 1e-9)
    if jax.process_count() == 1:  # several hosts: `host` holds this host's rows only
      rows = functools.partial(
        samples_log.grpo_rows, ctx.tokenizer, examples, host, rewards, std=std
      )
      loop.log_samples(step, rows)
    loop.end_step(step, state, values, params=state.params)
  return loop.result(state.params)


def _score_rollout(ctx: run_context.Context, completions, examples, group: int):
  """(this host's completions, rewards [P, G] of every host, new tokens of every host).

  Each host decodes and scores the rows on its own devices; only rewards cross hosts."""
  rows, host = train_loop.local_completions(completions)
  rows_examples = [examples[r // group] for r in rows]
  local_rewards = ctx.score(host.tokens, host.mask, rows_examples)
  num_rows = len(examples) * group
  rewards = sharding.gather_rows(rows, local_rewards, num_rows).reshape(len(examples), group)
  new_tokens = float(sharding.gather_rows(rows, host.lengths, num_rows).sum())
  return host, rewards, new_tokens


def step_metrics(rewards: np.ndarray, completions, adv_stats, update) -> dict[str, Any]:
  """Rewards, failed checks, rollout entropy and length, advantages and the update's metrics."""
  values: dict[str, Any] = {
    "train/reward": float(rewards.mean()),  # the name ES and GRPO share (ES: fitness/mean)
    "reward/mean": float(rewards.mean()),
    "reward/std": float(rewards.std()),
    "reward/per_prompt": rewards.mean(axis=1),
    "reward/frac_groups_all_equal": float(np.mean(rewards.max(1) == rewards.min(1))),
    # Non-finite rewards rank worst in their group (es_jax.grpo.loss.group_advantages); count them.
    "reward/non_finite": int(np.sum(~np.isfinite(rewards))),
  }
  values.update(failure_metrics())  # checks scored 0 on a timeout or crash
  rollout = jax.device_get(grpo_update.rollout_stats(completions))
  values.update({f"rollout/{k.removeprefix('rollout_')}": float(v) for k, v in rollout.items()})
  values["entropy/mean"] = values.pop("rollout/entropy")
  values["length/mean"] = values.pop("rollout/response_length")
  values.update({f"adv/{k}": float(np.mean(v)) for k, v in jax.device_get(adv_stats).items()})
  update = jax.device_get(update)
  # The largest of the step's optimizer updates, checked by end_step (max_update_ratio).
  values[run_guard.UPDATE_RATIO] = float(np.max(update.pop("update_ratio")))
  values.update({f"grpo/{k}": float(np.mean(v)) for k, v in update.items()})
  return values


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """A GRPO run: `config.grpo.num_steps` steps from the base model, then evaluation and export."""
  config_check.validate(config)
  return train_loop.run_single(config, workdir, "grpo", train)
