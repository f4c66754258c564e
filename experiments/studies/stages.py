"""What each stage of a study was measured under, so that a rerun never reuses another config's
results (the calibration, the pilots, the runs and their evaluations, the diversity study).

A stage directory holds `stage_config.json`: the config fields that decide its results (`fields`
below) and the values it took from earlier stages (σ, α, lr). A rerun reuses a stage only when
both are equal; otherwise it stops with one line naming the differing fields and the option that
starts the stage over (`--config.fair.redo=<stage>`, which also redoes every later stage). Every
check runs before any stage starts, so a refused attempt changes no file.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import ml_collections

from experiments.configs.choices import FAIR_STAGES
from experiments.evaluation.results import write_json
from experiments.runners.train_loop import config_differences
from experiments.schema.errors import ConfigError

RECORD = "stage_config.json"

# stage -> (config groups it depends on, fields within them that do not change its results).
# Budgets of later stages, logging and the decode layout (speed only) are left out.
_DEPENDS = {
  "calibration": (("seed", "model", "data", "es", "diversity"), ("num_steps", "learning_rate")),
  "pilots": (("seed", "model", "data", "es", "grpo", "fair"), ("num_steps", "redo")),
  "runs": (("seed", "model", "data", "es", "grpo", "eval", "demo", "fair"), ("redo",)),
  "diversity": (("seed", "model", "eval", "es", "diversity", "fair"), ("redo",)),
}
_ALWAYS_FREE = ("restart", "preregistration", "progress")


def fields(config: ml_collections.ConfigDict, stage: str) -> dict[str, Any]:
  """The config fields stage `stage` depends on (JSON-able)."""
  groups, free = _DEPENDS[stage]
  full = json.loads(json.dumps(config.to_dict(), default=repr))
  out = {}
  for group in groups:
    value = full.get(group)
    if isinstance(value, dict):
      value = {k: v for k, v in value.items() if k not in free + _ALWAYS_FREE}
    out[group] = value
  return out


def redo_list(config: ml_collections.ConfigDict) -> list[str]:
  """The stages `fair.redo` starts over: the named ones and every later one."""
  named = {s.strip() for s in str(config.fair.redo).split(",") if s.strip()}
  first = min((FAIR_STAGES.index(s) for s in named), default=len(FAIR_STAGES))
  return list(FAIR_STAGES[first:])


def _differences(path: str, record: dict[str, Any]) -> list[str]:
  with open(path) as f:
    saved = json.load(f)
  return [d.replace("in the checkpoint", "then") for d in config_differences(saved, record)]


def check_all(workdir: str, records: dict[str, dict[str, Any]], redo: list[str]) -> None:
  """Refuses (ConfigError, one line) before anything runs when a started stage of `workdir` was
  measured under other fields than `records[stage]`, has no record (files from before records,
  or planted), or follows a stage with no results; stages in `redo` are not checked (they will
  be removed). `records` is in stage order."""
  missing = None  # the first stage of `records` not started: no later one may hold results
  for stage, record in records.items():
    stage_dir = os.path.join(workdir, stage)
    if stage in redo or not os.path.isdir(stage_dir) or not os.listdir(stage_dir):
      missing = missing or stage
      continue
    path = os.path.join(stage_dir, RECORD)
    again = f"--config.fair.redo={stage} to start it (and every later stage) over"
    if missing:
      raise ConfigError(
        f"{stage_dir} holds results but the earlier stage {missing} has none (they came from "
        f"another study): use {again}, or a new workdir."
      )
    if not os.path.exists(path):
      raise ConfigError(
        f"{stage_dir} holds results without {RECORD} (the config they were measured under): "
        f"use {again}, or a new workdir."
      )
    diff = _differences(path, record)
    if diff:
      raise ConfigError(
        f"{stage_dir} was measured under another config: {'; '.join(diff[:6])}. Rerun with "
        f"the same values, use {again}, or a new workdir."
      )


def start(workdir: str, stage: str, record: dict[str, Any], redo: list[str]) -> str:
  """The directory of `stage`, emptied first when it is in `redo`, with its record written."""
  stage_dir = os.path.join(workdir, stage)
  if stage in redo and os.path.isdir(stage_dir):
    shutil.rmtree(stage_dir)
  os.makedirs(stage_dir, exist_ok=True)
  path = os.path.join(stage_dir, RECORD)
  if not os.path.exists(path):
    write_json(path, record)
  return stage_dir
