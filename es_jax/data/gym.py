"""reasoning-gym tasks generated offline (PyPI `reasoning-gym`), named "reasoning_gym/<task>".

These do not go through TFDS: reasoning-gym generates item i deterministically from
(seed + i, config) in microseconds, so there is nothing worth caching, and its `score_answer`
needs each item's `metadata` exactly as generated (tuples and all), which a JSON round trip would
change. Examples are generated lazily on access.

Seeds: reasoning-gym seeds item i with `seed + i`, so datasets with nearby seeds are the same
problems shifted by a few places. The generator seed is therefore derived by hashing
(task, split, seed): train and test, and seeds 0 and 1, get unrelated streams. Tasks with few
distinct problems (chain_sum with 2 one-digit terms has 200) still repeat problems across splits:
an evaluation that must be disjoint from training draws with `es_jax.data.heldout.draw_disjoint`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from typing import Any

PREFIX = "reasoning_gym/"


def is_gym_task(name: str) -> bool:
  return name.startswith(PREFIX)


def generator_seed(*, task: str, split: str, seed: int) -> int:
  """The seed handed to reasoning-gym for (task, split, seed); below 2**31."""
  digest = hashlib.sha256(f"{task}/{split}/{seed}".encode()).digest()
  return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def create_gym_dataset(
  task: str, split: str, *, size: int, seed: int, config: dict[str, Any] | None = None
):
  """The reasoning-gym dataset object for `task` (without the "reasoning_gym/" prefix).

  Args:
    task: a reasoning-gym dataset name, e.g. "chain_sum".
    split: any split name; it only changes the derived seed.
    size: number of items.
    seed: the user's seed.
    config: keyword arguments of the task's config class, e.g. {"min_terms": 2, "max_terms": 2,
      "min_digits": 1, "max_digits": 1} for chain_sum.

  Raises:
    ValueError: unknown task, or a config key the task does not take (the message lists them).
  """
  import reasoning_gym
  from reasoning_gym.factory import DATASETS

  if task not in DATASETS:
    close = difflib.get_close_matches(task, DATASETS, n=5)
    raise ValueError(
      f"reasoning_gym has no task {task!r}; close names: {close} "
      f"(all: reasoning_gym.factory.DATASETS, {len(DATASETS)} tasks)"
    )
  config = dict(config or {})
  accepted = {f.name for f in dataclasses.fields(DATASETS[task][1])} - {"seed", "size"}
  unknown = sorted(set(config) - accepted)
  if unknown:
    raise ValueError(
      f"reasoning_gym/{task}: unknown config keys {unknown}; the task takes {sorted(accepted)}"
    )
  if size < 1:
    raise ValueError(f"reasoning_gym/{task}: size (limit) must be at least 1, got {size}")
  return reasoning_gym.create_dataset(
    task, seed=generator_seed(task=task, split=split, seed=seed), size=size, **config
  )


def gym_example(dataset, index: int, *, task: str, split: str) -> dict[str, Any]:
  """Item `index` of a reasoning-gym dataset as a uniform example.

  Returns:
    {"id", "task" ("reasoning_gym/<task>"), "prompt" and "question" (the item's question),
    "answer", "metadata" (the item's own dict, for `reasoning_gym.get_score_answer_fn`)}.
  """
  item = dataset[index]
  return {
    "id": f"{split}-{index}",
    "task": PREFIX + task,
    "prompt": item["question"],
    "question": item["question"],
    "answer": str(item["answer"]),
    "metadata": item["metadata"],
  }
