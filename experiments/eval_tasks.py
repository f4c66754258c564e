"""The tasks of a final evaluation: `eval.task` and `eval.extra_tasks` as labelled `TaskSpec`s.

An extra task is a task name, or a dict with "task" and any of `EXTRA_TASK_FIELDS`. Its "average"
(default True) says whether it enters the macro average of eval/table.md; False gives it a row
of its own below that average (the Hard forgetting check averages CSQA, HotpotQA, GPQA-Diamond
and Countdown, the paper's four, and reports MBPP separately).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from experiments import run_data
from experiments.config_check import check


class TaskSpec(NamedTuple):
  """One task of `evaluate.evaluate_tasks`: a unique label, the reward/task name, its examples,
  and whether it enters the macro average."""

  label: str
  task: str
  examples: Sequence[dict]
  average: bool = True


def task_label(task: str) -> str:
  """A task's label in evaluation files and tables (its name, "/" replaced)."""
  return task.replace("/", "_")


EXTRA_TASK_FIELDS = (
  "task",
  "split",
  "limit",
  "task_config",
  "data_dir",
  "source_dir",
  "on_bad_row",
  "label",
  "average",
)


def extra_eval_tasks(ev: Mapping[str, Any], *, taken: set[str]) -> list[TaskSpec]:
  """The TaskSpecs of `eval.extra_tasks`: each entry a task name, or a dict with "task" and any
  of split, limit, data_dir, on_bad_row (default: eval's), task_config, source_dir, label
  (default: none / the task name), average (default True). Errors name the entry, e.g.
  `eval.extra_tasks[1].task`."""
  entries = ev.get("extra_tasks") or ()
  check(
    isinstance(entries, (list, tuple)),
    "eval.extra_tasks",
    entries,
    "give a list of task names or {task, split, limit, ...} dicts",
  )
  specs = []
  for i, entry in enumerate(entries):
    field = f"eval.extra_tasks[{i}]"
    entry = {"task": entry} if isinstance(entry, str) else entry
    check(isinstance(entry, Mapping), field, entry, "give a task name or a dict with 'task'")
    entry = dict(entry)
    unknown = sorted(set(entry) - set(EXTRA_TASK_FIELDS))
    check(not unknown, field, entry, f"unknown keys {unknown}; use {list(EXTRA_TASK_FIELDS)}")
    average = entry.pop("average", True)
    check(isinstance(average, bool), f"{field}.average", average, "need True or False")
    section = {
      "split": ev.get("split"),
      "limit": ev.get("limit"),
      "data_dir": ev.get("data_dir"),
      "on_bad_row": ev.get("on_bad_row"),
      "progress": ev.get("progress", True),
      **entry,
    }
    task = section.get("task")
    check(isinstance(task, str) and bool(task), f"{field}.task", task, "name the task")
    label = section.get("label") or task_label(task)
    check(
      label not in taken,
      f"{field}.label",
      label,
      "labels must be unique (the main eval task's included): set 'label'",
    )
    taken.add(label)
    specs.append(TaskSpec(label, task, run_data.load_examples(section, field), average))
  return specs
