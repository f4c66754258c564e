"""Evaluation problems disjoint from a training set: normalised prompts, overlap counts, and
reasoning-gym draws that skip training prompts and repeats.

Two problems are the same when their normalised prompts are equal: `normalize_prompt` folds case
(`str.casefold`) and collapses every run of whitespace to one space, trimming both ends. The
prompt is the example's "prompt" (the problem as shown to the model, before chat formatting;
lettered options included), so two rows that differ only in spacing or capitals count as one,
and rows that differ in any other character count as two.

  - `overlap(examples, exclude)`: N problems, how many distinct, how many seen in training.
  - `drop_seen(examples, exclude)`: the rows whose prompt is neither a training prompt nor an
    earlier row's (file and TFDS tasks: their rows are fixed, so overlap can only be dropped).
  - `draw_disjoint(...)`: `limit` distinct reasoning-gym problems outside `exclude`, drawn from the
    generator's stream in order (item i of the stream is a fixed function of seed and i, so the
    same arguments give the same problems); refused with `TaskSpaceTooSmallError` when
    `max_draws` items do not hold enough.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any, NamedTuple

from es_jax.data import gym
from es_jax.data.examples import TaskExamples

DRAWS_PER_PROBLEM = 20  # draw_disjoint's default bound: this many draws per problem asked for
MIN_DRAWS = 2000  # ... and never fewer (a small limit still searches a small space fully)


def normalize_prompt(text: str) -> str:
  """The prompt as compared: case folded, whitespace runs collapsed to one space, trimmed."""
  return " ".join(str(text).casefold().split())


def prompt_keys(examples: Iterable[dict[str, Any]]) -> frozenset[str]:
  """The normalised prompts of `examples` (e.g. a training pool), as a set."""
  return frozenset(normalize_prompt(ex["prompt"]) for ex in examples)


class Overlap(NamedTuple):
  """How many problems an evaluation has, how many are distinct, how many are training prompts
  (rows, not distinct prompts: a repeated training prompt counts each time)."""

  num_problems: int
  num_distinct: int
  num_seen_in_training: int

  def describe(self) -> str:
    """'N problems, N distinct, 0 seen in training'."""
    return (
      f"{self.num_problems} problems, {self.num_distinct} distinct, "
      f"{self.num_seen_in_training} seen in training"
    )


def overlap(examples: Sequence[dict[str, Any]], exclude: Collection[str]) -> Overlap:
  """The `Overlap` of `examples` with the normalised prompts `exclude` (`prompt_keys`)."""
  keys = [normalize_prompt(ex["prompt"]) for ex in examples]
  return Overlap(len(keys), len(set(keys)), sum(k in exclude for k in keys))


class _Subset(Sequence):
  """Rows `indices` of `examples`, with `source` (read-only; decoded on access)."""

  def __init__(self, examples, indices: Sequence[int], source: dict[str, Any]):
    self._examples, self._indices, self.source = examples, list(indices), source

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    return self._examples[self._indices[index]]


def drop_seen(examples: Sequence[dict[str, Any]], exclude: Collection[str]) -> Sequence[dict]:
  """The rows of `examples` whose normalised prompt is not in `exclude` and not an earlier row's,
  in order. The result's `source` is the input's (if any) with "dropped_seen" and
  "dropped_repeats" counts added."""
  kept, seen, dropped_seen, repeats = [], set(), 0, 0
  for i, ex in enumerate(examples):
    key = normalize_prompt(ex["prompt"])
    if key in exclude:
      dropped_seen += 1
    elif key in seen:
      repeats += 1
    else:
      seen.add(key)
      kept.append(i)
  source = dict(getattr(examples, "source", None) or {})
  source.update(used=len(kept), dropped_seen=dropped_seen, dropped_repeats=repeats)
  return _Subset(examples, kept, source)


class TaskSpaceTooSmallError(ValueError):
  """A generated task could not supply `limit` distinct problems outside the training set.

  Attributes:
    task, limit: what was asked for.
    found: distinct problems found outside `exclude`.
    draws: items drawn from the generator.
    space: distinct problems seen in the draws and the training set together: a lower bound on
      (and, when the draws repeat a lot, about) the number the task can generate.
  """

  def __init__(self, task: str, *, limit: int, found: int, draws: int, space: int):
    self.task, self.limit, self.found, self.draws, self.space = task, limit, found, draws, space
    super().__init__(
      f"{task}: only {found} distinct problems outside the training set in {draws} draws "
      f"(limit {limit}); the task appears to hold about {space} distinct problems"
    )


def draw_disjoint(
  name: str,
  split: str,
  *,
  limit: int,
  seed: int = 0,
  task_config: dict[str, Any] | None = None,
  exclude: Collection[str] = frozenset(),
  max_draws: int | None = None,
):
  """`limit` distinct reasoning-gym problems whose normalised prompts are not in `exclude`.

  Items are drawn in order from the stream `load_task(name, split, seed=seed,
  task_config=task_config)` draws from; a training prompt or a repeat is skipped. An example's
  "id" is "<split>-<stream index>", so ids stay those of `load_task` for the items kept.

  Args:
    name: "reasoning_gym/<task>".
    split, seed, task_config: as in `es_jax.data.load_task`.
    limit: problems wanted (>= 1).
    exclude: normalised prompts to leave out (`prompt_keys` of the training pool).
    max_draws: give up after this many items (None: max(DRAWS_PER_PROBLEM·limit, MIN_DRAWS)).

  Returns:
    A `TaskExamples` of `limit` examples; its `source` adds "draws" (items drawn) and "excluded"
    (the size of `exclude`).

  Raises:
    TaskSpaceTooSmallError: fewer than `limit` such problems in `max_draws` items.
    ValueError: not a reasoning-gym task, a bad limit, or what `load_task` refuses.
  """
  if not gym.is_gym_task(name):
    raise ValueError(f"draw_disjoint: {name!r} is not a reasoning_gym/<task> task")
  if limit < 1:
    raise ValueError(f"draw_disjoint: limit must be >= 1, got {limit}")
  if max_draws is None:
    max_draws = max(DRAWS_PER_PROBLEM * limit, MIN_DRAWS)
  task = name[len(gym.PREFIX) :]
  dataset = gym.create_gym_dataset(task, split, size=max_draws, seed=seed, config=task_config)
  kept, seen = [], set()
  for i in range(max_draws):
    key = normalize_prompt(dataset[i]["question"])
    if key in seen:
      continue
    seen.add(key)
    if key not in exclude:
      kept.append(i)
      if len(kept) == limit:
        break
  if len(kept) < limit:
    space = len(seen | set(exclude))
    raise TaskSpaceTooSmallError(name, limit=limit, found=len(kept), draws=max_draws, space=space)
  draws = kept[-1] + 1
  return TaskExamples(
    task=name,
    split=split,
    length=limit,
    get=lambda j: gym.gym_example(dataset, kept[j], task=task, split=split),
    source={
      "generator": "reasoning_gym",
      "seed": seed,
      "rows": limit,
      "limit": limit,
      "draws": draws,
      "excluded": len(exclude),
    },
  )
