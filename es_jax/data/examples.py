"""The examples a task loads into: `TaskExamples`, a read-only, random-access list decoded on
access, and the warning for a split smaller than the limit asked for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from es_jax.data.readers import BadRowError


class DataSmallerThanLimitWarning(UserWarning):
  """A task split holds fewer examples than the `limit` asked for."""


class TaskExamples(Sequence):
  """A read-only, random-access list of examples, decoded on access.

  Attributes:
    task: the task name given to `load_task`.
    split: the split.
    num_skipped: bad rows skipped (on_bad_row="skip"); 0 otherwise.
    bad_rows: the skipped rows' `BadRowError`s (at most `builders.MAX_STORED_BAD_ROWS`).
    source: where the examples come from, JSON-serialisable: task, split, rows (in the split),
      limit, used (= len), and for file datasets source_dir, prepared_dir and the source files'
      SHA-256 ("files"); for reasoning-gym the seed.
  """

  def __init__(
    self,
    *,
    task: str,
    split: str,
    length: int,
    get: Callable[[int], dict[str, Any]],
    num_skipped: int = 0,
    bad_rows: Sequence[BadRowError] = (),
    source: dict[str, Any] | None = None,
  ):
    self.task, self.split = task, split
    self.source = {"task": task, "split": split, **(source or {}), "used": length}
    self.num_skipped, self.bad_rows = num_skipped, list(bad_rows)
    self._length, self._get = length, get

  def __len__(self) -> int:
    return self._length

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self._get(i) for i in range(*index.indices(self._length))]
    if not -self._length <= index < self._length:
      raise IndexError(f"{self.task}/{self.split}: index {index} out of range [0, {self._length})")
    return self._get(index % self._length)

  def __repr__(self) -> str:
    return (
      f"TaskExamples(task={self.task!r}, split={self.split!r}, len={self._length}, "
      f"num_skipped={self.num_skipped})"
    )
