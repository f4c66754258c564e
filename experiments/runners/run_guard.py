"""Stops a training run that cannot be learning, in one line, instead of finishing "successfully".

Three checks, for ES and GRPO alike (`experiments.runners.train_loop.Loop` calls them every step):

- every reward of a step is NaN or ±inf: nothing ranks above anything, the step carries no
  signal (a broken reward, or a model producing garbage); stopped before the update.
- the update is too large: ``‖Δθ‖₂ / ‖θ‖₂ > config.max_update_ratio`` for one optimizer update
  (ES: one step; GRPO: the largest of a step's mini-batch updates), θ the weights it was
  applied to. For ES it is about α / (√N · RMS of the weights); a run moves its weights by a
  small fraction per step (the shipped configs' `:smoke` runs, on random tiny models whose small
  weights give the largest ratios, reach at most 0.012; docs/usage.md), so a ratio above
  `DEFAULT_MAX_UPDATE_RATIO` means the learning rate is far off (`es.learning_rate=1e30`) and
  the weights will hold noise or overflow.
- the updated weights hold NaN or ±inf (checked in `train_loop.Loop.end_step`).

Each raises `RunDivergedError`, which `experiments.main` prints as one `error: ...` line with a
non-zero exit status; nothing of the failing step is checkpointed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# The default of config.max_update_ratio (experiments/configs/base.py).
DEFAULT_MAX_UPDATE_RATIO = 0.1
# The metric each runner logs: ‖Δθ‖₂ / ‖θ‖₂ of the step's (largest) update.
UPDATE_RATIO = "update/relative_norm"


class RunDivergedError(FloatingPointError):
  """The run stopped because it cannot be learning (non-finite rewards or weights, an update
  far too large); the message is one line naming the step and what to change."""


def _sum_squares(tree) -> jax.Array:
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)


def relative_norm(delta, params) -> jax.Array:
  """``‖delta‖₂ / ‖params‖₂`` over all floating-point leaves, in float32 (jittable). An
  overflowing update gives +inf, a NaN one NaN: both fail `check_update`."""
  return jnp.sqrt(_sum_squares(delta)) / jnp.maximum(jnp.sqrt(_sum_squares(params)), 1e-30)


def relative_change(new, old) -> jax.Array:
  """``‖new − old‖₂ / ‖old‖₂`` (jittable): `relative_norm` of the change between two trees."""
  delta = jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32), new, old)
  return relative_norm(delta, old)


def check_rewards(rewards, *, method: str, step: int, reward: str) -> None:
  """Raises RunDivergedError when no reward of the step is finite.

  Args:
    rewards: the step's rewards (ES: [N, P] per member and prompt; GRPO: [P, G]).
    method: "es" or "grpo", for the message.
    step: the global step.
    reward: the reward's name (config.data.reward, or the task's own when empty).
  """
  rewards = np.asarray(rewards, dtype=np.float64)
  if rewards.size and not np.isfinite(rewards).any():
    raise RunDivergedError(
      f"{method}: every one of the {rewards.size} rewards of step {step} is NaN or infinite "
      f"(reward {reward!r}); stopped before updating: make the reward return finite numbers."
    )


def check_update(ratio: float, *, limit: float, method: str, step: int, field: str) -> None:
  """Raises RunDivergedError when ``ratio`` (``‖Δθ‖/‖θ‖``) is above `limit` or not finite.

  Args:
    ratio: the step's `UPDATE_RATIO` value.
    limit: config.max_update_ratio (0 = no check).
    method: "es" or "grpo", for the message.
    step: the global step.
    field: the learning-rate field to lower, e.g. "es.learning_rate".
  """
  if limit > 0 and not ratio <= limit:  # NaN fails too
    raise RunDivergedError(
      f"{method}: the update of step {step} changed the weights by {ratio:.3g} of their norm "
      f"(‖Δθ‖/‖θ‖ > max_update_ratio={limit:g}); stopped before checkpointing it: lower "
      f"{field} (or raise --config.max_update_ratio if this is intended)."
    )
