"""What every stage of a run shares (`Context`, built once by `make_context`): the config, the
model, the data (experiments.runners.run_data), the mesh (with the TPU memory check) and the
held-out
`evaluate.Evaluator` (periodic and final evaluation, through experiments.evaluation.evaluate)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections

from es_jax import models
from es_jax.decode import sampling
from es_jax.devices import memory_plan
from es_jax.devices import sharding as sharding_lib
from experiments.evaluation import data as eval_data
from experiments.evaluation import evaluate
from experiments.evaluation import resume as eval_resume
from experiments.infra.progress import format_seconds
from experiments.runners import model_io, run_data
from experiments.schema import check as config_check
from experiments.schema.check import check
from experiments.tpu import memory_check

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Context:
  """What every stage of a run shares; built once by `make_context`."""

  config: ml_collections.ConfigDict
  workdir: str
  model_config: models.ModelConfig
  tokenizer: Any
  base_params: Any
  keys: dict[str, jax.Array]
  examples: Any  # the training pool
  score: Callable
  evaluator: evaluate.Evaluator
  mesh: Any
  eos_ids: tuple[int, ...]
  pad_id: int
  data_sources: dict[str, Any] = dataclasses.field(default_factory=dict)  # in versions.json


def make_mesh(config: ml_collections.ConfigDict):
  """The ('pop', 'model') mesh of `config.mesh` (pop 0: every device)."""
  return sharding_lib.make_mesh(int(config.mesh.pop) or None, int(config.mesh.model))


def check_memory(
  config: ml_collections.ConfigDict,
  model_config: models.ModelConfig,
  mesh,
  *,
  devices: Sequence[Any] | None = None,
  prompt_len: int = memory_plan.PROMPT_LEN,
) -> None:
  """On TPU devices, raises ValueError when `config`'s programs are predicted not to fit.

  The chip comes from the first device's `device_kind` and its HBM from `memory_stats()` when the
  runtime reports it (else the published size, es_jax.devices.memory_plan.CHIPS). The error names
  the config field to lower and the limit. Other platforms, and `mesh.check_memory=False`, skip it.
  """
  if not bool(config.mesh.check_memory):
    return
  devices = list(devices if devices is not None else jax.devices())
  device = devices[0]
  if device.platform != "tpu":
    return
  chip = memory_plan.chip_for_device(device)
  if chip is None:
    log.warning("mesh.check_memory: unknown TPU %r, memory not checked", device.device_kind)
    return
  memory_check.check_config_fits(
    config,
    model_config,
    chip,
    programs=memory_check.METHOD_PROGRAMS[config.method],
    pop=int(mesh.shape["pop"]),
    model=int(mesh.shape["model"]),
    prompt_len=prompt_len,
  )


def cheap_checks(config: ml_collections.ConfigDict, keys: dict) -> tuple[list, Any, Any]:
  """What a run checks before its model loads, so that a mistake there is reported in seconds:
  the data and evaluation files and their fields, the reward's import and one call on the first
  training example (`run_data.load_reward`), evaluation problems disjoint from the training pool
  (experiments.evaluation.data). Returns the training pool, the reward and the `Evaluator` (no
  tokenizer yet).

  Raises:
    ConfigError: one line naming the field, file or example and what to do.
  """
  section = {**config.data.to_dict(), "progress": bool(config.progress)}
  examples = run_data.load_examples(section, "data", options=run_data.file_options(config.data))
  reward = run_data.load_reward(config.data, run_data.reward_name(config.data), examples)
  eval_tasks = eval_data.load_eval_tasks(config, eval_data.training_set(config, examples))
  return examples, reward, evaluate.Evaluator(config, None, keys, eval_tasks)


def make_context(config: ml_collections.ConfigDict, workdir: str) -> Context:
  """Loads the model, tokenizer, training pool and evaluation set that `config` names; the data
  and evaluation files, their fields and the reward (`run_data.load_reward`) are checked first,
  before the model loads.

  Raises:
    ConfigError: the workdir holds another method's run, the population does not split over the
      devices, or a file or the data cannot be loaded. The config's values are trusted: the
      runner's `run` validated them (`config_check.validate`).
  """
  config_check.check_workdir(config, workdir)
  mesh = make_mesh(config)
  if config.method in ("es", "sequential"):  # before loading: members run in chunks per device
    pop, chunk = int(mesh.shape["pop"]), int(config.es.members_per_chunk)
    check(
      config.es.population_size % (pop * chunk) == 0,
      "es.population_size",
      config.es.population_size,
      f"must be divisible by the mesh's pop axis ({pop} devices, config.mesh.pop) x "
      f"es.members_per_chunk={chunk} = {pop * chunk}: change one of them",
    )
  keys = run_data.run_keys(config.seed)
  examples, reward, evaluator = cheap_checks(config, keys)
  t0 = time.perf_counter()
  with config_check.user_errors("config.model"):
    model, tokenizer = model_io.load_model(config.model, seed=config.seed)
  evaluator.tokenizer = tokenizer
  with config_check.user_errors("config.mesh.check_memory"):
    check_memory(config, model.config, mesh)
  n_params = sum(int(x.size) for x in jax.tree.leaves(models.params(model)))
  log.info(
    "model: %s (%.1fM parameters, %s) loaded in %s",
    model_io.model_label(config.model),
    n_params / 1e6,
    model.config.dtype,
    format_seconds(time.perf_counter() - t0),
  )
  if config.eval.final and not config.eval.restart:  # before any file is written
    eval_resume.prepare(evaluator, os.path.join(workdir, "eval"), restart=False)
  data_sources = {
    "data": run_data.examples_source(examples),
    "eval": run_data.examples_source(evaluator.examples),
  }
  for i, spec in enumerate(evaluator.extra):
    data_sources[f"eval.extra_tasks[{i}]"] = run_data.examples_source(spec.examples)
  log.info(
    "data: %d training examples of %s; evaluation: %d problems of %s%s",
    len(examples),
    config.data.task,
    len(evaluator.examples),
    config.eval.task,
    f" + {len(evaluator.extra)} more tasks" if evaluator.extra else "",
  )
  return Context(
    config=config,
    workdir=os.fspath(workdir),
    model_config=model.config,
    tokenizer=tokenizer,
    base_params=models.params(model),
    keys=keys,
    examples=examples,
    score=run_data.make_scorer(tokenizer, reward),
    evaluator=evaluator,
    mesh=mesh,
    eos_ids=run_data.eos_ids(tokenizer),
    pad_id=sampling.pad_id(tokenizer),
    data_sources=data_sources,
  )
