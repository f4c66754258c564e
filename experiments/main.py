"""Runs the experiment a config file names.

    python -m experiments.main --config experiments/configs/NAME.py[:variant] --workdir DIR \
        [--config.key=value ...]

`config.method` picks the runner: es, grpo, sequential, evaluate, demo, sparsity,
population_sweep, diversity or report (each module exposes `run(config, workdir)`). The config
is locked: an unknown key or a value of the wrong type is refused naming it. Rerunning the same
command resumes from the newest checkpoint in DIR; a second run on a DIR in use is refused
(`experiments.workdir_lock`). On a multi-host TPU slice run the same command
on every worker (jax.distributed joins them).
"""

from __future__ import annotations

import importlib
import json
import logging

from absl import app, flags
from ml_collections import config_flags

from es_jax import sharding
from experiments.workdir_lock import WorkdirLock

RUNNERS = {  # method -> module:function(config, workdir)
  "es": "experiments.es:run",
  "grpo": "experiments.grpo:run",
  "sequential": "experiments.sequential:run",
  "evaluate": "experiments.train_lib:evaluate_run",
  "demo": "experiments.demo:run",
  "sparsity": "experiments.sparsity:run",
  "population_sweep": "experiments.population_sweep:run",
  "diversity": "experiments.diversity:run",
  "report": "experiments.report:run",
}
_CONFIG = config_flags.DEFINE_config_file("config", None, "config file[:variant]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (local or gs://)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger().setLevel(logging.INFO)
  sharding.initialize_distributed()
  config = _CONFIG.value
  if config.method not in RUNNERS:
    raise app.UsageError(f"config.method={config.method!r}: use one of {sorted(RUNNERS)}")
  module, function = RUNNERS[config.method].split(":")
  with WorkdirLock(_WORKDIR.value):
    result = getattr(importlib.import_module(module), function)(config, _WORKDIR.value)
  summary = {k: v for k, v in (result or {}).items() if k in ("stopped", "eval", "report")}
  print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
  app.run(main)
