"""Your own question/answer file as a task: `load_file_task(path, ...)`.

The file is JSON lines, a JSON list, CSV with a header, or Parquet (with pyarrow installed), one
problem per row (`es_jax.data.readers`). Two fields are read, their names configurable: the
question (shown to the model) and the answer (the gold the reward compares with: text, a number,
or for the `qa` reward a list of accepted strings). Every other field of the row is kept in the
example, so a reward can read it (e.g. `test_list` for the `code` reward).

Each example is {"id" (the row's "id" field, else "<file name>:<line>"), "task": "file",
"prompt" (the question), "answer", the row's other fields, "system_prompt", "instruction"}: the
system prompt and the answer-format instruction for the reward (`prompts.REWARD_PROMPTS`), which
`format_prompt` puts into the model's chat template. With a `prompt_template` the example also
holds "prompt_text": the template filled with the row's fields (`{question}` is always the
question), fed to the model as is, without chat template.

A bad row (invalid JSON, a missing, empty or NaN question or answer, a CSV record with more or
fewer fields than the header, a template field the row lacks) raises `BadRowError` naming the
file, line and field, or is skipped and counted with on_bad_row="skip". A file whose first row
lacks the question or answer field raises `ColumnError` (the field names are wrong), and a file
that cannot be parsed past some point (a CSV quote left open, a corrupt Parquet file) raises
`BadRowError` naming it whatever on_bad_row says.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import string
import warnings
from pathlib import Path
from typing import Any

from es_jax.data import prompts
from es_jax.data.examples import DataSmallerThanLimitWarning, TaskExamples
from es_jax.data.readers import BadRowError, FieldError, arrow_dataset_files, read_rows

log = logging.getLogger(__name__)
FILE_TASK = "file"
_RESERVED = ("task", "prompt", "answer", "system_prompt", "instruction", "prompt_text")


def template_fields(template: str) -> list[str]:
  """The field names a prompt template uses ("{question}" -> ["question"]).

  Raises:
    ValueError: the template is not a valid format string, or uses positional fields.
  """
  try:
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
  except ValueError as e:
    raise ValueError(f"prompt_template {template!r} is not a valid format string: {e}") from None
  bad = [n for n in names if not n or n.isdigit()]
  if bad:
    raise ValueError(
      f"prompt_template {template!r}: use named fields such as {{question}}, not {{}} or {{0}}"
    )
  return [n.split(".")[0].split("[")[0] for n in names]


def _text(row: dict, field: str, *, aliases_ok: bool) -> str | list[str]:
  if field not in row or row[field] is None:
    raise FieldError(field, "missing")
  value = row[field]
  if aliases_ok and isinstance(value, list):
    if value and all(isinstance(v, str) and v.strip() for v in value):
      return value
    raise FieldError(field, f"a list must hold non-empty strings, got {value!r:.80}")
  if isinstance(value, bool) or not isinstance(value, str | int | float):
    raise FieldError(field, f"expected text or a number, got {type(value).__name__}")
  if isinstance(value, float) and not math.isfinite(value):
    raise FieldError(field, f"{value} (a missing value?): expected text or a finite number")
  text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
  if not text.strip():
    raise FieldError(field, "empty")
  return text


def file_example(
  row: dict[str, Any],
  *,
  fallback_id: str,
  question_field: str,
  answer_field: str,
  prompt_template: str,
  reward: str,
) -> dict[str, Any]:
  """One row as an example (module docstring); FieldError naming the field when it is unusable."""
  question = _text(row, question_field, aliases_ok=False)
  answer = _text(row, answer_field, aliases_ok=True)
  system, instruction = prompts.reward_prompts(reward)
  example = {k: v for k, v in row.items() if k not in _RESERVED}
  example.update(
    id=str(row["id"]) if row.get("id") not in (None, "") else fallback_id,
    task=FILE_TASK,
    prompt=question,
    answer=answer,
    system_prompt=system,
    instruction=instruction,
  )
  if prompt_template:
    values = {**row, "question": question, "answer": answer}
    for name in template_fields(prompt_template):
      if name not in values:
        raise FieldError(name, "used by the prompt template but missing from the row")
    example["prompt_text"] = prompt_template.format_map(values)
  return example


def _sha256(path: str) -> str:
  """Of the file, or of a saved `datasets` split's Arrow files in order."""
  digest = hashlib.sha256()
  files = arrow_dataset_files(Path(path)) if os.path.isdir(path) else [Path(path)]
  for file in files:
    with open(file, "rb") as f:
      for block in iter(lambda f=f: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()


class ColumnError(ValueError):
  """The file's first row lacks the question or answer field: the field names are wrong, not a
  row (raised whatever `on_bad_row` says).

  Attributes:
    option: the argument that names the field, "question_field" or "answer_field".
    value: the field name it holds.
    present: the fields the first row has.
  """

  def __init__(self, path: str, option: str, value: str, present: list[str]):
    super().__init__(
      f"{path}: no field {value!r} in the first row; its fields are {present}: name the "
      f"{option.split('_')[0]}'s field with {option}"
    )
    self.option, self.value, self.present = option, value, present


def _check_columns(path: str, row: dict, fields: dict[str, Any]) -> None:
  for option in ("question_field", "answer_field"):
    if fields[option] not in row:
      raise ColumnError(path, option, fields[option], [str(k) for k in row])


def _read_examples(path: str, *, limit: int | None, on_bad_row: str, **fields):
  """(examples, bad rows) of `path` in file order, up to `limit` examples; `fields` are
  `file_example`'s field names, template and reward. Raises the first bad row with
  on_bad_row="raise", and ColumnError when the first readable row lacks a field."""
  unit, rows = read_rows(Path(path))
  examples, bad = [], []
  name = os.path.basename(path)
  checked = False
  for line, row in rows:
    if limit is not None and len(examples) >= limit:
      break
    if not checked and isinstance(row, dict):
      _check_columns(path, row, fields)
      checked = True
    try:
      if isinstance(row, FieldError):
        raise row
      examples.append(file_example(row, fallback_id=f"{name}:{line}", **fields))
    except FieldError as e:
      error = BadRowError(path=path, line=line, unit=unit, field=e.field, reason=e.reason)
      if on_bad_row == "raise":
        raise error from None
      bad.append(error)
  return examples, bad


def load_file_task(
  path: str,
  *,
  question_field: str = "question",
  answer_field: str = "answer",
  prompt_template: str = "",
  reward: str = "qa",
  limit: int | None = None,
  on_bad_row: str = "raise",
):
  """The examples of a question/answer file (module docstring), in file order.

  Args:
    path: a .jsonl, .json, .csv or .parquet file, or a directory that Hugging Face `datasets`
      wrote with `save_to_disk` (one split; read with pyarrow).
    question_field, answer_field: the names of the question and answer fields in the file.
    prompt_template: "" for the model's chat template with the reward's system prompt and
      answer-format instruction; else a format string over the row's fields, e.g.
      "Question: {question}\\nAnswer:", fed to the model as is.
    reward: the reward name (`es_jax.rewards`) or "module:function"; picks the answer-format
      instruction of the chat prompt.
    limit: keep the first `limit` good rows (None: all).
    on_bad_row: "raise" (BadRowError naming file, line and field) or "skip" (counted).

  Returns:
    A `TaskExamples` (es_jax.data.examples) with task "file".

  Raises:
    FileNotFoundError: no such file.
    BadRowError: a bad row with on_bad_row="raise".
    ValueError: a file without a single good row, an unsupported file type or a bad prompt
      template.
  """
  if on_bad_row not in ("raise", "skip"):
    raise ValueError(f"load_file_task: on_bad_row must be 'raise' or 'skip', got {on_bad_row!r}")
  if not (os.path.isfile(path) or os.path.isdir(path)):
    raise FileNotFoundError(
      f"{path}: no such data file (a .jsonl, .json, .csv or .parquet file, or a saved `datasets` "
      "split directory)."
    )
  if prompt_template:
    template_fields(prompt_template)  # a broken template fails once, before any row
  examples, bad = _read_examples(
    path,
    question_field=question_field,
    answer_field=answer_field,
    prompt_template=prompt_template,
    reward=reward,
    limit=limit,
    on_bad_row=on_bad_row,
  )
  if bad:
    log.warning("%s: skipped %d bad row(s); first: %s", path, len(bad), bad[0])
  if not examples:
    raise ValueError(
      f"{path}: no usable row ({len(bad)} bad, fields {question_field!r}, {answer_field!r})."
    )
  if limit is not None and len(examples) < limit:
    message = f"{path}: limit={limit} but the file has only {len(examples)} usable row(s)."
    log.warning(message)
    warnings.warn(message, DataSmallerThanLimitWarning, stacklevel=2)
  source = {"path": os.path.abspath(path), "sha256": _sha256(path), "limit": limit}
  return TaskExamples(
    task=FILE_TASK,
    split="file",
    length=len(examples),
    get=examples.__getitem__,
    num_skipped=len(bad),
    bad_rows=bad[:100],
    source={**source, "rows": len(examples) + len(bad)},
  )
