"""Non-finite rewards and parameters: GRPO ranks NaN rewards worst, no runner saves NaN weights,
non-finite learning rates are refused."""

import logging
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_configs import smoke_config

from es_jax.grpo import loss as grpo_lib
from es_jax.persist import preemption
from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import demo as demo_config
from experiments.infra.logger import read_metrics
from experiments.runners import es_runner, grpo_runner, run_data, run_guard, train_loop


def _config(**overrides):
  quiet = dict(eval__every=0, eval__final=False, export_hf=False)
  return smoke_config(demo_config, **{**quiet, **overrides})


def test_group_advantages_rank_non_finite_rewards_worst():
  rewards = jnp.array([[1.0, jnp.nan, 0.0, 0.5], [jnp.inf, 1.0, 1.0, 0.0], [jnp.nan] * 4])
  adv, stats = grpo_lib.group_advantages(rewards)
  adv = np.asarray(adv)
  assert np.all(np.isfinite(adv)) and all(np.isfinite(float(v)) for v in stats.values())
  assert adv[0, 1] == adv[0].min() < adv[0, 2]  # NaN below the finite 0.0
  assert adv[1, 0] == adv[1].min() < adv[1, 3]  # +inf is not a great reward either
  np.testing.assert_array_equal(adv[2], 0.0)  # nothing finite: no signal
  finite = np.asarray(grpo_lib.group_advantages(jnp.array([[1.0, 0.0, 0.0, 0.5]]))[0])
  assert not np.allclose(finite[0], adv[0])  # the NaN row is not just passed through as zero


@pytest.mark.slow
def test_grpo_nan_reward_keeps_params_finite_and_is_counted(tmp_path, monkeypatch):
  real = run_data.make_scorer

  def nan_first_row(tokenizer, reward):
    score = real(tokenizer, reward)

    def wrapped(tokens, mask, examples):
      out = score(tokens, mask, examples)
      out[0] = np.nan
      return out

    return wrapped

  monkeypatch.setattr(run_data, "make_scorer", nan_first_row)
  config = _config(method="grpo", grpo__num_steps=1)
  grpo_runner.run(config, str(tmp_path))
  rows = [r for r in read_metrics(os.path.join(tmp_path, "metrics.jsonl")) if r["step"] == 1]
  assert rows and rows[0]["reward/non_finite"] == 1
  ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  state = ckpt.restore().state
  ckpt.close()
  leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
  assert all(np.all(np.isfinite(x)) for x in leaves if np.issubdtype(x.dtype, np.floating))


@pytest.mark.slow
def test_non_finite_update_stops_before_checkpoint(tmp_path, monkeypatch):
  real = es_runner._apply

  calls = []

  def poison_step_two(state, fitness, step_key, learning_rate, *, rule):
    out, ratio = real(state, fitness, step_key, learning_rate, rule=rule)
    calls.append(1)
    if len(calls) == 2:  # one NaN in one leaf is enough
      leaves, tree = jax.tree.flatten(out["params"])
      leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
      out = {**out, "params": jax.tree.unflatten(tree, leaves)}
    return out, ratio

  monkeypatch.setattr(es_runner, "_apply", poison_step_two)
  config = _config(method="es", es__num_steps=2, checkpoint__every=1)
  with pytest.raises(train_loop.NonFiniteParamsError, match=r"es: the update of step 2"):
    es_runner.run(config, str(tmp_path))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  assert ckpt.all_steps() == [1]
  ckpt.close()


@pytest.mark.parametrize("method", ["es", "grpo"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_learning_rate_is_refused(method, value, tmp_path):
  config = _config(**{f"{method}__learning_rate": value})
  runner = es_runner if method == "es" else grpo_runner
  with pytest.raises(ValueError, match=rf"config\.{method}\.learning_rate=.*finite"):
    runner.run(config, str(tmp_path))  # validated before anything loads
  assert not os.listdir(tmp_path)


def _nan_scorer(monkeypatch):
  """Every reward NaN (a reward that returns nothing usable)."""
  real = run_data.make_scorer

  def all_nan(tokenizer, reward):
    score = real(tokenizer, reward)
    return lambda tokens, mask, examples: np.full_like(score(tokens, mask, examples), np.nan)

  monkeypatch.setattr(run_data, "make_scorer", all_nan)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["es", "grpo"])
def test_all_non_finite_rewards_stop_before_the_update(tmp_path, monkeypatch, method):
  _nan_scorer(monkeypatch)
  config = _config(method=method, **{f"{method}__num_steps": 2})
  runner = es_runner if method == "es" else grpo_runner
  with pytest.raises(run_guard.RunDivergedError, match=rf"{method}: every one of the \d+ rewards"):
    runner.run(config, str(tmp_path))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  assert ckpt.all_steps() == []  # the first step was not applied, nothing saved
  ckpt.close()
  assert not os.path.exists(tmp_path / "DONE")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["es", "grpo"])
def test_update_ratio_is_logged_and_a_huge_one_stops_the_run(tmp_path, method):
  steps = {f"{method}__num_steps": 2, "checkpoint__every": 1}
  config = _config(method=method, **steps)
  runner = es_runner if method == "es" else grpo_runner
  runner.run(config, str(tmp_path / "ok"))
  rows = [r for r in read_metrics(str(tmp_path / "ok" / "metrics.jsonl")) if r["step"] > 0]
  ratios = [r[run_guard.UPDATE_RATIO] for r in rows]
  assert len(ratios) == 2 and all(0 < x < run_guard.DEFAULT_MAX_UPDATE_RATIO for x in ratios)
  # The same run, its limit below what it measured: stopped at step 1, nothing checkpointed.
  low = _config(method=method, max_update_ratio=min(ratios) / 2, **steps)
  with pytest.raises(run_guard.RunDivergedError, match=rf"{method}: the update of step 1"):
    runner.run(low, str(tmp_path / "low"))
  ckpt = Checkpointer(str(tmp_path / "low" / "checkpoints"), async_save=False)
  assert ckpt.all_steps() == []
  ckpt.close()
  # An absurd learning rate: the weights stay finite for a while, the ratio catches it.
  huge = _config(method=method, **{f"{method}__learning_rate": 1e30}, **steps)
  with pytest.raises(run_guard.RunDivergedError, match=rf"lower {method}\.learning_rate"):
    runner.run(huge, str(tmp_path / "huge"))


def test_stop_before_the_first_step_claims_no_checkpoint(tmp_path, caplog):
  config = _config(method="es", es__num_steps=2)
  with preemption.sigterm_scope() as handler:
    os.kill(os.getpid(), signal.SIGTERM)  # at startup, before the first step
    assert handler.requested
    with caplog.at_level(logging.WARNING):
      result = es_runner.run(config, str(tmp_path))
  assert result == {"stopped": True}
  assert "no checkpoint saved yet" in caplog.text and "checkpoint of step" not in caplog.text
