"""Sequential schedules (docs/method.md §4): GRPO→ES or ES→GRPO within one budget of update steps.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/grpo_es \
        --config.method=sequential --config.sequential.order=grpo_es

`sequential.total_steps` is split into round(total · first_fraction) first-stage steps and the
rest for the second stage, which starts from the first stage's final params. Each stage keeps its
own checkpoints (workdir/stage1_<method>/, workdir/stage2_<method>/); metrics go to one
metrics.jsonl with global steps (stage two continues the count) and a `stage` column. The data
stream continues across the boundary (experiments.runners.run_data). A resumed run whose first stage
is finished restores that stage's final checkpoint and runs none of its steps again. A SIGTERM at
any moment (during stage one's last step included) saves and ends the run before stage two or the
final evaluation start; rerunning continues.

GRPO's KL term (grpo.beta > 0) anchors to `sequential.kl_reference`: "base" (default: the
original model, as in a GRPO-only run, so the penalty means the same in every method) or
"stage1" (ES→GRPO only: the ES stage's output, so GRPO is pulled toward what ES found).
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from es_jax.persist import preemption
from experiments.configs.choices import SEQUENTIAL_ORDERS
from experiments.runners import es_runner, grpo_runner, run_context, run_data, train_loop
from experiments.schema import check as config_check

TRAINERS = {"es": es_runner.train, "grpo": grpo_runner.train}


def split_budget(total: int, first_fraction: float) -> tuple[int, int]:
  """(first, second) stage steps, each at least 1, of `total` >= 2 steps (a validated config:
  0 < first_fraction < 1)."""
  first = min(max(round(total * first_fraction), 1), total - 1)
  return first, total - first


def stages(config: ml_collections.ConfigDict, workdir: str) -> list[train_loop.Stage]:
  """The two stages of the schedule `config.sequential` names (a validated config)."""
  seq = config.sequential
  n1, n2 = split_budget(int(seq.total_steps), float(seq.first_fraction))
  (m1, m2) = SEQUENTIAL_ORDERS[seq.order]
  first_samples = n1 * run_data.samples_per_step(config, m1)
  return [
    train_loop.Stage(m1, n1, os.path.join(workdir, f"stage1_{m1}", "checkpoints"), 0, f"1_{m1}"),
    train_loop.Stage(
      m2, n2, os.path.join(workdir, f"stage2_{m2}", "checkpoints"), n1, f"2_{m2}", first_samples
    ),
  ]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Both stages, then the final evaluation and export of the second stage's params."""
  config_check.validate(config)  # sequential.kl_reference among them, before anything runs
  reference = config.sequential.kl_reference
  with preemption.sigterm_scope():  # one flag for both stages and the final evaluation
    ctx = run_context.make_context(config, workdir)
    params = ctx.base_params
    for i, stage in enumerate(stages(config, ctx.workdir)):
      extra = {}
      if stage.name == "grpo" and i == 1 and reference == "stage1":
        extra["ref_params"] = params  # ES→GRPO: the KL anchors to the ES stage's output
      result = TRAINERS[stage.name](ctx, params, stage, **extra)
      if not result.finished:  # SIGTERM, even during its last step: stage two is not started
        return train_loop.finish(ctx, result.params, stopped=True, saved=result.saved)
      params = result.params
    return train_loop.finish(ctx, params, stopped=False)
