"""Per-dataset row formats: raw file rows -> stored fields -> uniform examples.

`PARSERS[task](row, fallback_id=...)` validates one raw row of the original file and returns the
fields the TFDS builder stores (always "id", "question", "answer", plus task-specific fields), or
raises `FieldError` naming the field. `finalize(task, stored, seed=...)` turns stored fields into
the example every consumer sees: {"id", "task", "prompt", "answer", ...}. The prompt is the problem
as shown to the model (before chat formatting): for multiple choice it includes the lettered
options and "answer" is the letter. GPQA's options are shuffled here, per row, from (seed, id), so
prepared data does not depend on the seed.

Field names accepted per dataset (first present wins):
  gsm8k       question, answer ("... #### <number>"; gold = the number, commas removed)
  deepscaler  problem, answer, solution (optional)
  math500     problem, answer, solution, subject, level (int or "Level N"), unique_id
  aime24/25   problem | Problem | question, answer | Answer (an integer), id | ID, solution
  amc23       problem | question | Problem, answer | Answer (a number or a string), id | ID
  countdown   nums | numbers (list of ints), target (int)
  csqa        id, question.stem, question.choices [{label, text}], answerKey; or the flattened
              form question (str), choices {label: [...], text: [...]}, answerKey
  gpqa        Question, Correct Answer, Incorrect Answer 1..3, Record ID, High-level domain
  hotpotqa    _id | id, question, answer, context [[title, [sentences]]] (optional), type, level
  mbpp        task_id, text | prompt, code, test_list, test_setup_code | test_imports,
              challenge_test_list (optional)
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from typing import Any

from es_jax.data.readers import FieldError

LETTERS = "ABCDEFGHIJ"
MULTIPLE_CHOICE_TASKS = ("csqa", "gpqa")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")


def _get(row: dict, names: tuple[str, ...], *, required: bool = True, default: Any = None) -> Any:
  """The value of the first of `names` present in `row` (dotted names reach into objects)."""
  for name in names:
    value: Any = row
    for part in name.split("."):
      value = value.get(part) if isinstance(value, dict) else None
    if value is not None:
      return value
  if required:
    also = f" (also looked for {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
    raise FieldError(names[0], f"missing{also}")
  return default


def _text(row: dict, *names: str, required: bool = True) -> str:
  """A non-empty string field; numbers are accepted and written without a trailing '.0'."""
  value = _get(row, names, required=required, default="")
  if isinstance(value, bool) or not isinstance(value, str | int | float):
    raise FieldError(names[0], f"expected text, got {type(value).__name__}: {value!r:.80}")
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  text = str(value).strip()
  if required and not text:
    raise FieldError(names[0], "empty")
  return text


def _integer(row: dict, *names: str, required: bool = True, default: int = 0) -> int:
  value = _get(row, names, required=required, default=default)
  try:
    return _as_int(value)
  except ValueError:
    raise FieldError(names[0], f"expected an integer, got {value!r:.80}") from None


def _as_int(value: Any) -> int:
  """An int64 from an int, an integral float or a string of digits; ValueError otherwise."""
  if isinstance(value, bool):
    raise ValueError(value)
  if isinstance(value, int):
    number = value
  elif isinstance(value, float) and value.is_integer():
    number = int(value)
  elif isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d{1,30}\s*", value):
    number = int(value)
  else:
    raise ValueError(value)
  if not -(2**63) <= number < 2**63:  # stored as int64
    raise ValueError(value)
  return number


def _text_list(row: dict, *names: str, required: bool = True) -> list[str]:
  value = _get(row, names, required=required, default=[])
  if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
    raise FieldError(names[0], f"expected a list of strings, got {value!r:.80}")
  return list(value)


def parse_gsm8k(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """GSM8K: gold is the number after the last '####', thousands commas removed."""
  question = _text(row, "question")
  full_answer = _text(row, "answer")
  if "####" not in full_answer:
    raise FieldError("answer", "no '####' marker before the final answer ('... #### 42')")
  solution, _, gold = full_answer.rpartition("####")
  gold = gold.strip().replace(",", "")
  if not _NUMBER.fullmatch(gold):
    raise FieldError("answer", f"the text after '####' is not a number: {gold!r:.80}")
  return {"id": fallback_id, "question": question, "answer": gold, "solution": solution.strip()}


def parse_deepscaler(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """DeepScaleR: problem / answer / solution."""
  return {
    "id": fallback_id,
    "question": _text(row, "problem"),
    "answer": _text(row, "answer"),
    "solution": _text(row, "solution", required=False),
  }


def parse_math500(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """MATH-500: problem / answer / solution / subject / level / unique_id."""
  level = _get(row, ("level",), required=False, default=0)
  if isinstance(level, str) and level.startswith("Level "):
    level = level[len("Level ") :]
  try:
    level = _as_int(level)
  except ValueError:
    raise FieldError("level", f"expected an integer or 'Level N', got {level!r:.80}") from None
  return {
    "id": _text(row, "unique_id", required=False) or fallback_id,
    "question": _text(row, "problem"),
    "answer": _text(row, "answer"),
    "solution": _text(row, "solution", required=False),
    "subject": _text(row, "subject", required=False),
    "level": level,
  }


def parse_aime(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """AIME 2024/2025: the gold answer must be an integer."""
  answer = _text(row, "answer", "Answer")
  try:
    answer = str(_as_int(answer))
  except ValueError:
    raise FieldError("answer", f"AIME answers are integers, got {answer!r:.80}") from None
  return {
    "id": _text(row, "id", "ID", required=False) or fallback_id,
    "question": _text(row, "problem", "Problem", "question"),
    "answer": answer,
    "solution": _text(row, "solution", "Solution", required=False),
  }


def parse_amc(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """AMC 2023: numeric answers are written without a trailing '.0'."""
  return {
    "id": _text(row, "id", "ID", required=False) or fallback_id,
    "question": _text(row, "problem", "question", "Problem"),
    "answer": _text(row, "answer", "Answer"),
    "solution": _text(row, "solution", "Solution", required=False),
  }


def parse_countdown(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """Countdown: the question is built from nums and target; the gold is the target."""
  nums = _get(row, ("nums", "numbers"))
  try:
    nums = [_as_int(n) for n in nums]
  except (TypeError, ValueError):
    raise FieldError("nums", f"expected a list of integers, got {nums!r:.80}") from None
  if len(nums) < 2:
    raise FieldError("nums", f"need at least two numbers, got {nums}")
  target = _integer(row, "target")
  question = (
    f"Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once."
  )
  return {
    "id": fallback_id,
    "question": question,
    "answer": str(target),
    "nums": nums,
    "target": target,
  }


def parse_csqa(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """CommonsenseQA, original or flattened form: the gold is the answer letter."""
  if isinstance(row.get("question"), dict):  # The original release.
    stem = _text(row, "question.stem")
    raw_choices = _get(row, ("question.choices",))
    if not isinstance(raw_choices, list) or not all(isinstance(c, dict) for c in raw_choices):
      raise FieldError(
        "question.choices", f"expected a list of {{label, text}}: {raw_choices!r:.80}"
      )
    pairs = [(c.get("label"), c.get("text")) for c in raw_choices]
    choices_field = "question.choices"
  else:  # The flattened Hugging Face form.
    stem = _text(row, "question")
    raw_choices = _get(row, ("choices",))
    if not isinstance(raw_choices, dict):
      raise FieldError("choices", f"expected {{label: [...], text: [...]}}: {raw_choices!r:.80}")
    pairs = list(zip(raw_choices.get("label") or [], raw_choices.get("text") or [], strict=False))
    choices_field = "choices"
  labels = [label for label, _ in pairs]
  if labels != list(LETTERS[: len(pairs)]) or len(pairs) < 2:
    raise FieldError(choices_field, f"expected labels A, B, C, ... in order, got {labels}")
  if not all(isinstance(text, str) and text.strip() for _, text in pairs):
    raise FieldError(choices_field, "every choice needs a non-empty text")
  answer_key = _text(row, "answerKey")
  if answer_key not in labels:
    raise FieldError("answerKey", f"{answer_key!r} is not one of the labels {labels}")
  return {
    "id": _text(row, "id", required=False) or fallback_id,
    "question": stem,
    "answer": answer_key,
    "choices": [text.strip() for _, text in pairs],
  }


def parse_gpqa(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """GPQA CSV row: the gold is the correct answer's text until `finalize` shuffles it."""
  return {
    "id": _text(row, "Record ID", required=False) or fallback_id,
    "question": _text(row, "Question"),
    "answer": _text(row, "Correct Answer"),
    "incorrect_answers": [_text(row, f"Incorrect Answer {i}") for i in (1, 2, 3)],
    "domain": _text(row, "High-level domain", required=False),
  }


def parse_hotpotqa(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """HotpotQA: question / answer, context kept as JSON text."""
  context = _get(row, ("context",), required=False, default=[])
  well_formed = isinstance(context, list) and all(
    isinstance(p, list | tuple)
    and len(p) == 2
    and isinstance(p[0], str)
    and isinstance(p[1], list)
    and all(isinstance(s, str) for s in p[1])
    for p in context
  )
  if not well_formed:
    raise FieldError("context", f"expected [[title, [sentence, ...]], ...], got {context!r:.80}")
  return {
    "id": _text(row, "_id", "id", required=False) or fallback_id,
    "question": _text(row, "question"),
    "answer": _text(row, "answer"),
    "context": json.dumps(context, ensure_ascii=False),
    "type": _text(row, "type", required=False),
    "level": _text(row, "level", required=False),
  }


def parse_mbpp(row: dict, *, fallback_id: str) -> dict[str, Any]:
  """MBPP: the gold is the reference code; test_imports join the setup code."""
  test_list = _text_list(row, "test_list")
  if not test_list:
    raise FieldError("test_list", "empty: an MBPP problem needs at least one assert")
  setup = _text(row, "test_setup_code", required=False)
  imports = _text_list(row, "test_imports", required=False)
  return {
    "id": str(_integer(row, "task_id")),
    "task_id": _integer(row, "task_id"),
    "question": _text(row, "text", "prompt"),
    "answer": _text(row, "code"),
    "test_list": test_list,
    "test_setup_code": "\n".join([*imports, setup]).strip(),
    "challenge_test_list": _text_list(row, "challenge_test_list", required=False),
  }


PARSERS: dict[str, Callable[..., dict[str, Any]]] = {
  "gsm8k": parse_gsm8k,
  "deepscaler": parse_deepscaler,
  "math500": parse_math500,
  "aime24": parse_aime,
  "aime25": parse_aime,
  "amc23": parse_amc,
  "countdown": parse_countdown,
  "csqa": parse_csqa,
  "gpqa": parse_gpqa,
  "hotpotqa": parse_hotpotqa,
  "mbpp": parse_mbpp,
}


def options_text(choices: list[str]) -> str:
  """'A. first\\nB. second\\n...' for a list of choice texts."""
  return "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(choices))


def shuffled_choices(
  correct: str, incorrect: list[str], *, seed: int, row_id: str
) -> tuple[list[str], str]:
  """Shuffles the options of one row reproducibly from (seed, row id).

  Returns:
    (choices, letter of the correct choice).
  """
  digest = hashlib.sha256(f"{seed}/{row_id}".encode()).digest()
  order = [correct, *incorrect]
  random.Random(int.from_bytes(digest[:8], "little")).shuffle(order)
  return order, LETTERS[order.index(correct)]


def finalize(task: str, stored: dict[str, Any], *, seed: int = 0) -> dict[str, Any]:
  """The uniform example for one stored row.

  Args:
    task: the dataset's name, one of `PARSERS`.
    stored: the fields the builder stored (str / int / lists, already decoded from bytes).
    seed: seeds GPQA's per-row option shuffle.

  Returns:
    {"id", "task", "prompt", "question", "answer", ...task-specific fields}.
  """
  example = {**stored, "task": task, "prompt": stored["question"]}
  if task == "csqa":
    example["answer_text"] = stored["choices"][LETTERS.index(stored["answer"])]
  elif task == "gpqa":
    choices, letter = shuffled_choices(
      stored["answer"], stored["incorrect_answers"], seed=seed, row_id=stored["id"]
    )
    example.pop("incorrect_answers")
    example.update(choices=choices, answer=letter, answer_text=stored["answer"])
  elif task == "hotpotqa":
    example["context"] = json.loads(stored["context"])
    if example["context"]:
      paragraphs = "\n\n".join(f"{title}: {''.join(sents)}" for title, sents in example["context"])
      example["prompt"] = f"{paragraphs}\n\nQuestion: {stored['question']}"
  elif task == "mbpp":
    tests = "\n".join(stored["test_list"])
    example["prompt"] = (
      f"You are an expert Python programmer, and here is your task: {stored['question']} "
      f"Your code should pass these tests:\n\n{tests}"
    )
  if task in MULTIPLE_CHOICE_TASKS:
    example["prompt"] = f"{example['question']}\n\n{options_text(example['choices'])}"
  return example
