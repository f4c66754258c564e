"""The fields of held-out evaluation (`config.eval`): periodic (a small slice every `every`
steps) and final (`limit` problems, more tasks in `extra_tasks`)."""

from __future__ import annotations

from typing import Any

from experiments.fields.run import task_source_fields
from experiments.schema.values import (
  NON_NEGATIVE,
  PROBABILITY,
  Field,
  Group,
  boolean,
  int_sequence,
  integer,
  task_name,
  text,
)


def _task_list(x: Any) -> str | None:
  """A list of tasks; each entry is checked when the evaluation loads
  (experiments.evaluation.tasks)."""
  return None if isinstance(x, list | tuple) else "need a list"


EVAL = Group(
  "held-out evaluation: periodic (every `every` steps, a small slice) and final",
  {
    "task": Field(
      "reasoning_gym/chain_sum",
      task_name,
      "as data.task; 'file' reads `path` with data's fields, template and reward",
    ),
    "path": Field("", text(), "task 'file': the held-out file ('' = data.path, the training file)"),
    "split": Field("test", text(empty_ok=False), "the dataset split"),
    "limit": Field(64, integer(1), "problems in the final evaluation"),
    **task_source_fields(),
    "drop_seen": Field(
      False,
      boolean,
      "every evaluation is disjoint from the training pool: reasoning-gym tasks draw problems "
      "outside it; a file or TFDS task's rows that are training prompts are counted and warned "
      "about, and with drop_seen=True dropped, repeated rows too (experiments.evaluation.data)",
    ),
    "num_samples": Field(8, integer(1), "n samples per problem at `temperature` (paper: 32)"),
    "temperature": Field(0.6, NON_NEGATIVE, "sampling temperature (0 = greedy)"),
    "top_p": Field(1.0, PROBABILITY, "nucleus sampling's p"),
    "max_new_tokens": Field(64, integer(1), "tokens generated per sample at most"),
    "batch_size": Field(64, integer(1), "rows decoded together"),
    "refill": Field(
      False,
      boolean,
      "continuous batching (es_jax.decode.queue): a block's samples go through batch_size rows, a "
      "row refilled as its sample ends, so decode steps follow the tokens generated rather than "
      "each batch's longest completion; draws per sample differ from refill=False's (own keys)",
    ),
    "ks": Field(
      (1, 2, 4, 8),
      int_sequence(1),
      "k of Pass@k and Maj@k, each <= num_samples (periodic: k <= its n only)",
    ),
    "every": Field(
      0, integer(0), "periodic eval every this many steps (0 = only before and after training)"
    ),
    "periodic_limit": Field(
      16, integer(1), "problems in a periodic eval (the first `periodic_limit` of the slice)"
    ),
    "periodic_num_samples": Field(4, integer(1), "samples per problem in a periodic eval"),
    "final": Field(
      True, boolean, "evaluate the final params on `limit` problems and write WORKDIR/eval"
    ),
    "restart": Field(
      False,
      boolean,
      "start the final evaluation over, moving a saved WORKDIR/eval to eval.stale-<n> (a resume "
      "with other eval settings is refused otherwise); every run with it set starts over",
    ),
    "keep_samples": Field(
      16,
      integer(0),
      "the final evaluation's prompt, completions, extracted answers and verdicts of the first "
      "keep_samples problems of each task, in eval/<label>.samples.jsonl (0 = none)",
    ),
    "extra_tasks": Field(
      (),
      _task_list,
      "more tasks for the final evaluation (macro-averaged with `task`): task names, or dicts "
      "{task, split, limit, task_config, data_dir, source_dir, on_bad_row, label, average}; "
      "split, limit, data_dir and on_bad_row default to this section's; average=False: a row of "
      "its own, not in the macro average. E.g. held-out tasks for forgetting (docs/method.md §7)",
    ),
  },
)
