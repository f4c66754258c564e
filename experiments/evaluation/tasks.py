"""What an evaluation covers and how: its tasks as labelled `TaskSpec`s (`eval.task`, resolved
by `eval_section`, and `eval.extra_tasks`) and the `EvalSettings` each is evaluated with.

An extra task is a task name, or a dict with "task" and any of `EXTRA_TASK_FIELDS`. Its "average"
(default True) says whether it enters the macro average of eval/table.md; False gives it a row
of its own below that average. (The paper's forgetting averages take every held-out task of the
setting: Easy CSQA, HotpotQA, GPQA-Diamond, MBPP and Countdown; Hard the same without HotpotQA.)
The problems of every task are loaded disjoint from the training pool by
`experiments.evaluation.data`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections

from es_jax import data
from es_jax.decode import sampling
from experiments import fields
from experiments.schema.check import check

log = logging.getLogger(__name__)


class TaskSpec(NamedTuple):
  """One task of `evaluate.evaluate_model` / `evaluate_tasks`: a unique label (file names,
  tables), the reward/task name that scores it, its examples, whether it enters the macro
  average, and optional functions replacing the task's own prompt and scoring."""

  label: str
  task: str
  examples: Sequence[dict]
  average: bool = True
  # example -> prompt text (default: `es_jax.data.format_prompt(example, tokenizer)`).
  prompt_fn: Callable[[dict], str] | None = None
  # (completion, example) -> bool (default: `es_jax.rewards.is_correct(..., task=task)`).
  correct_fn: Callable[[str, dict], bool] | None = None
  # completion -> normalised answer or None, for Maj@k (default: `es_jax.rewards.answer_key`).
  answer_fn: Callable[[str], Any] | None = None
  # How many examples are training prompts (experiments.evaluation.data); None: not measured.
  num_seen_in_training: int | None = None


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """How a task is evaluated: what is sampled, what is kept and what is shown.

  Validated on construction (a ConfigError naming the field, ``EvalSettings.num_samples=0``;
  ``decoding`` validated itself). The sampling fields (num_samples, the decoding's budget,
  temperature, top-p and stop tokens, batch_size, greedy, refill) are stored in
  ``<label>.meta.json``: resuming with other values is refused.

  Attributes:
    num_samples: n, samples per problem at the decoding's temperature (paper: 32).
    decoding: how each sample is decoded (`sampling.Decoding`): its budget, temperature (paper:
      0.6), top-p (paper: off), stop tokens (none given: the tokenizer's EOS; the pad token is
      always the tokenizer's) and layout (kv_chunk, compactions; config.decode: speed only, not
      stored in the meta).
    batch_size: rows per generate call (fixed; see the module docstring for the layout).
    refill: decode each block's samples as one queue through `batch_size` rows
      (`experiments.evaluation.sampler`); its samples draw with their own keys.
    greedy: also decode one greedy sample per problem.
    ks: the k of Pass@k and Maj@k in the table; those above n are dropped, 1 is always kept.
    resume: reuse the finished problems in out_dir's jsonl; False starts over.
    report: write table.md, table.json and pass_at_k.png for this task alone into out_dir.
    save_text: also store the decoded completions in the records.
    keep_samples: write `<label>.samples.jsonl` (with out_dir) for the first this many problems.
    progress: show a tqdm bar (only when stderr is a terminal).
    log_progress: log a progress line (problems done, Pass@1 so far, ETA) about every 10%, and
      the summary at INFO (else DEBUG).
  """

  num_samples: int
  decoding: sampling.Decoding
  batch_size: int
  refill: bool = False
  greedy: bool = True
  ks: tuple[int, ...] = (1, 16, 32)
  resume: bool = True
  report: bool = True
  save_text: bool = False
  keep_samples: int = 0
  progress: bool = True
  log_progress: bool = False

  def __post_init__(self):
    need = functools.partial(check, prefix="EvalSettings.")
    for name in ("num_samples", "batch_size"):
      value = getattr(self, name)
      need(int(value) >= 1, name, value, "must be >= 1")
      object.__setattr__(self, name, int(value))
    kind = type(self.decoding).__name__
    need(isinstance(self.decoding, sampling.Decoding), "decoding", kind, "give a sampling.Decoding")
    object.__setattr__(self, "ks", tuple(self.ks))


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


def extra_task_sections(
  ev: Mapping[str, Any], *, taken: set[str]
) -> list[tuple[str, str, dict[str, Any]]]:
  """(field, label, section) of each entry of `eval.extra_tasks`: a task name, or a dict with
  "task" and any of split, limit, data_dir, on_bad_row (default: eval's), task_config,
  source_dir, label (default: none / the task name), average (default True; in the section).
  Errors name the entry, e.g. `eval.extra_tasks[1].task`; `experiments.evaluation.data` loads
  them."""
  entries = ev.get("extra_tasks") or ()  # a list (the field's rule); each entry checked here
  out = []
  for i, entry in enumerate(entries):
    field = f"eval.extra_tasks[{i}]"
    entry = {"task": entry} if isinstance(entry, str) else entry
    check(isinstance(entry, Mapping), field, entry, "give a task name or a dict with 'task'")
    entry = dict(entry)
    unknown = sorted(set(entry) - set(EXTRA_TASK_FIELDS))
    check(not unknown, field, entry, f"unknown keys {unknown}; use {list(EXTRA_TASK_FIELDS)}")
    average = entry.setdefault("average", True)
    check(isinstance(average, bool), f"{field}.average", average, "need True or False")
    section = {
      "split": ev.get("split"),
      "limit": ev.get("limit"),
      "data_dir": ev.get("data_dir"),
      "on_bad_row": ev.get("on_bad_row"),
      "progress": ev.get("progress", fields.default("progress")),
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
    out.append((field, label, section))
  return out


def eval_section(config: ml_collections.ConfigDict) -> tuple[dict[str, Any], str, str]:
  """(config.eval as a dict, plus config.progress, the name that scores it, its label). Task
  "file" reads eval.path, else data.path (the training file: logged as a warning), and scores
  with data.reward."""
  ev = config.eval
  section = {k: ev[k] for k in ev.keys()}
  section["progress"] = bool(config.progress)  # TFDS's bars (run_data)
  if ev.task != data.FILE_TASK:
    return section, ev.task, task_label(ev.task)
  if not section.get("path"):
    section["path"] = config.data.path
    log.warning("eval.path is empty: evaluating on the training file %s", config.data.path)
  stem = os.path.splitext(os.path.basename(section["path"]))[0]
  return section, config.data.reward, task_label(f"file_{stem}")
