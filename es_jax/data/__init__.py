"""Tasks for training and evaluation: `load_task(name, split)` and prompt formatting.

Three kinds of task:
  - datasets read from the original files the user downloaded once (gsm8k, deepscaler, math500,
    aime24, aime25, amc23, countdown, csqa, gpqa, hotpotqa, mbpp), prepared by TFDS builders into
    array_record files and read with `as_data_source` (no TensorFlow; see `builders` and
    `prepared`);
  - "reasoning_gym/<task>" problems generated offline by reasoning-gym (see `gym`);
  - "file": your own question/answer file (JSONL, JSON, CSV, Parquet), `load_file_task` (see
    `files`).

Evaluation problems disjoint from a training set (`heldout`): `draw_disjoint` draws reasoning-gym
problems outside a set of normalised training prompts, `overlap` counts a fixed split's
problems, distinct problems and training prompts, and `drop_seen` leaves those rows out.

Every example is a dict with at least "id", "task", "prompt" (the problem as shown to the model,
before chat formatting; lettered options included for multiple choice) and "answer" (the gold
string: a number, a letter, a short answer or reference code), plus task-specific fields
("nums"/"target" for countdown, "test_list" for mbpp, "choices" for csqa/gpqa, "metadata" for
reasoning-gym, ...). `format_prompt` turns an example into the model's input text.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from es_jax.data import formats, gym, heldout
from es_jax.data.examples import DataSmallerThanLimitWarning, TaskExamples
from es_jax.data.files import FILE_TASK, ColumnError, load_file_task
from es_jax.data.heldout import (
  Overlap,
  TaskSpaceTooSmallError,
  draw_disjoint,
  drop_seen,
  normalize_prompt,
  overlap,
  prompt_keys,
)
from es_jax.data.prompts import (
  INSTRUCTIONS,
  PLAIN_SYSTEM_PROMPT,
  SYSTEM_PROMPT,
  build_messages,
  format_prompt,
)
from es_jax.data.readers import BadRowError, FieldError

__all__ = [
  "DataFiles",
  "FILE_TASK",
  "INSTRUCTIONS",
  "PLAIN_SYSTEM_PROMPT",
  "SYSTEM_PROMPT",
  "TASKS",
  "BadRowError",
  "ColumnError",
  "FieldError",
  "DataSmallerThanLimitWarning",
  "Overlap",
  "TaskExamples",
  "TaskSpaceTooSmallError",
  "build_messages",
  "draw_disjoint",
  "drop_seen",
  "format_prompt",
  "heldout",
  "load_file_task",
  "load_task",
  "normalize_prompt",
  "overlap",
  "prompt_keys",
]

log = logging.getLogger(__name__)
# The file-backed tasks: the TFDS builders of `es_jax.data.builders` (tested equal to its
# BUILDERS). Named here so that importing es_jax does not import tensorflow_datasets: only
# loading one of these tasks does.
TASKS = (
  "gsm8k",
  "deepscaler",
  "math500",
  "aime24",
  "aime25",
  "amc23",
  "countdown",
  "csqa",
  "gpqa",
  "hotpotqa",
  "mbpp",
)
DEFAULT_GYM_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class DataFiles:
  """Where a file dataset's copies live, for `load_task` (reasoning-gym tasks read no files).

  Attributes:
    data_dir: where prepared TFDS data lives (None: TFDS's default).
    source_dir: the directory with this dataset's downloaded original files (one directory per
      dataset), prepared into `data_dir` unless exactly these files are (`prepared.prepare`).
      None reads the one copy prepared in `data_dir`.
    progress: show TFDS's progress bars while a dataset is prepared (on a terminal only).
  """

  data_dir: str | None = None
  source_dir: str | None = None
  progress: bool = True


def load_task(
  name: str,
  split: str,
  *,
  files: DataFiles = DataFiles(),
  limit: int | None = None,
  seed: int = 0,
  on_bad_row: str = "raise",
  task_config: dict[str, Any] | None = None,
) -> TaskExamples:
  """Loads the examples of one task split.

  Args:
    name: a dataset in `TASKS`, or "reasoning_gym/<task>" (e.g. "reasoning_gym/chain_sum").
    split: e.g. "train" / "test" (which splits exist depends on the dataset's files; gpqa has
      "diamond" / "main" / "extended"). For reasoning-gym any name; it changes the problems.
    files: where the dataset's prepared copy and original files are (`DataFiles`); a
      reasoning-gym task takes none (source_dir must be None).
    limit: keep the first `limit` examples (file order); a split with fewer examples gives a
      `DataSmallerThanLimitWarning`. For reasoning-gym, the number of problems to generate
      (default `DEFAULT_GYM_SIZE`).
    seed: seeds GPQA's per-row option shuffle and reasoning-gym's generator.
    on_bad_row: "raise" to raise the first bad row's `BadRowError` (a ValueError naming file,
      line and field), or "skip" to leave bad rows out; the count is in `num_skipped`, and
      logged as a warning.
    task_config: reasoning-gym task config keywords, e.g. {"min_terms": 2, "max_terms": 2,
      "min_digits": 1, "max_digits": 1} for chain_sum. Must be None for file datasets.

  Returns:
    A `TaskExamples` sequence of example dicts (see the module docstring).

  Raises:
    BadRowError: a bad row, with on_bad_row="raise".
    ValueError: unknown task, split or option; copies from several source directories and no
      source_dir.
    FileNotFoundError: the dataset is neither prepared nor given a source_dir holding its files.
  """
  if on_bad_row not in ("raise", "skip"):
    raise ValueError(f"load_task: on_bad_row must be 'raise' or 'skip', got {on_bad_row!r}")
  if limit is not None and limit < 0:
    raise ValueError(f"load_task: limit must be None or >= 0, got {limit}")
  if gym.is_gym_task(name):
    if files.source_dir is not None:
      raise ValueError(f"load_task: {name} is generated, not read from files; drop source_dir")
    return _gym_task(name, split, limit=limit, seed=seed, task_config=task_config)
  if name not in TASKS:
    raise ValueError(
      f"load_task: unknown task {name!r}; known: {', '.join(TASKS)}, or 'reasoning_gym/<task>'"
    )
  if task_config:
    raise ValueError(f"load_task: task_config is for reasoning_gym tasks only, not {name!r}")
  from es_jax.data import prepared  # imports tensorflow_datasets (module docstring)

  builder = prepared.prepare(
    name, data_dir=files.data_dir, source_dir=files.source_dir, progress=files.progress
  )
  return _prepared_task(builder, name, split, limit=limit, seed=seed, on_bad_row=on_bad_row)


def _gym_task(name, split, *, limit, seed, task_config) -> TaskExamples:
  """`limit` reasoning-gym problems (None: `DEFAULT_GYM_SIZE`), generated offline."""
  task = name[len(gym.PREFIX) :]
  size = DEFAULT_GYM_SIZE if limit is None else limit
  dataset = gym.create_gym_dataset(task, split, size=size, seed=seed, config=task_config)
  return TaskExamples(
    task=name,
    split=split,
    length=size,
    get=lambda i: gym.gym_example(dataset, i, task=task, split=split),
    source={"generator": "reasoning_gym", "seed": seed, "rows": size, "limit": limit},
  )


def _bad_rows(builder, name: str, split: str, on_bad_row: str) -> tuple[int, list[BadRowError]]:
  """(count, the stored `BadRowError`s) of a prepared split; raises the first one with
  on_bad_row="raise", and refuses a split that was never prepared."""
  from es_jax.data import builders

  metadata = builder.info.metadata
  num_bad = metadata.get("num_bad_rows", {}).get(split, 0)
  bad_rows = [BadRowError.from_dict(r) for r in metadata.get("bad_rows", {}).get(split, [])]
  splits = set(builder.info.splits.keys())
  if split not in splits and split not in metadata.get("num_bad_rows", {}):
    raise ValueError(
      f"load_task: {name} has no split {split!r} in {builder.data_dir} (prepared: "
      f"{sorted(splits)}); a split is prepared when its file exists in source_dir: "
      f"{builders.expected_files(name)}"
    )
  if num_bad and on_bad_row == "raise":
    raise BadRowError.from_dict(
      metadata["bad_rows"][split][0],
      hint=f"{name}/{split} has {num_bad} bad row(s); fix the file, or pass on_bad_row='skip' "
      "to skip and count them",
    )
  if num_bad:
    log.warning(
      "%s/%s: skipped %d bad row(s); first: %s",
      name,
      split,
      num_bad,
      bad_rows[0] if bad_rows else "",
    )
  return num_bad, bad_rows


def _prepared_task(builder, name, split, *, limit, seed, on_bad_row) -> TaskExamples:
  """The examples of split `split` of a prepared file-backed dataset (`load_task`)."""
  from es_jax.data import builders, prepared

  metadata = builder.info.metadata
  origin = {
    "source_dir": metadata.get("source_dir"),
    "prepared_dir": str(builder.data_dir),
    "files": metadata.get("sources", {}).get(split, []),
    "limit": limit,
  }
  num_bad, bad_rows = _bad_rows(builder, name, split, on_bad_row)
  if split not in set(builder.info.splits.keys()):  # The split's files hold no valid row.
    if not num_bad:
      raise ValueError(f"load_task: {name}/{split} has no rows ({builders.expected_files(name)})")
    return TaskExamples(
      task=name,
      split=split,
      length=0,
      get=None,
      num_skipped=num_bad,
      bad_rows=bad_rows,
      source={**origin, "rows": 0},
    )
  source = builder.as_data_source(split=split)
  length = len(source) if limit is None else min(limit, len(source))
  if limit is not None and limit > len(source):
    message = (
      f"{name}/{split}: limit={limit} but the split has only {len(source)} example(s) (from "
      f"{origin['source_dir']}); using {len(source)}."
    )
    log.warning(message)
    warnings.warn(message, DataSmallerThanLimitWarning, stacklevel=3)  # load_task's caller

  def get(index: int) -> dict[str, Any]:
    return formats.finalize(name, prepared.to_python(source[index]), seed=seed)

  return TaskExamples(
    task=name,
    split=split,
    length=length,
    get=get,
    num_skipped=num_bad,
    bad_rows=bad_rows,
    source={**origin, "rows": len(source)},
  )
