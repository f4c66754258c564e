"""Math rewards: boxed answers graded with math-verify (GSM8K, MATH, DeepScaleR, AIME, AMC).

Training reward (docs/method.md §1, the paper's):

    r = 1.0               if the last `\\boxed{...}` answer is equivalent to the gold answer
        format_reward     (0.1) if a boxed answer exists but is wrong
        0.0               if there is no boxed answer

The answer is the last brace-matched `\\boxed{...}` (or `\\fbox{...}`). With `hash_fallback=True`
(the rewards named `math_hash` / `gsm8k_hash`, an opt-in) the number after GSM8K's `####` is used
next and also counts as formatted. With `fallback="last_number"` the last number in the text is
used after that; it can earn 1.0 but never the format credit (measured: SmolLM2-135M boxes ~1% of
the time, so without it small models' rewards are almost all zero).

Evaluation correctness (`math_correct`, `gsm8k_correct`, `math_answer_key`; docs/method.md §5) is
the equivalence of the boxed answer, falling back to the `####` number: always `hash_fallback`.

Equivalence: two plain numbers are compared exactly in-process (`1,234` = `1234.0`); anything
else goes to math-verify (`0.5` = `\\frac{1}{2}`, `x=5` = `5`) in the killable worker of
`es_jax.rewards.verifier`, with a hard deadline `timeout_s` (a check that misses it counts as
wrong). Boxes over 1,000 characters count as no answer; answers with braces nested deeper than 32
count as wrong without being parsed.
"""

import re
from fractions import Fraction
from typing import NamedTuple

from es_jax.rewards import extract, verifier

FALLBACKS = (None, "last_number")


class MathAnswer(NamedTuple):
  text: str | None  # extracted answer, None when nothing was found
  formatted: bool  # found in \boxed{} or after ####


def _check_fallback(fallback):
  if fallback not in FALLBACKS:
    raise ValueError(f"fallback={fallback!r} is not one of {FALLBACKS}.")


def extract_math_answer(
  completion: str, *, hash_fallback: bool = True, fallback: str | None = None
) -> MathAnswer:
  """The graded answer: last `\\boxed{}`, else (with `hash_fallback`) the `####` number, else
  (with `fallback="last_number"`) the last number."""
  _check_fallback(fallback)
  boxed = extract.last_boxed(completion)
  if boxed is not None:
    return MathAnswer(boxed, True)
  hashed = extract.hash_answer(completion) if hash_fallback else None
  if hashed is not None:
    return MathAnswer(hashed, True)
  if fallback == "last_number":
    return MathAnswer(extract.last_number(completion), False)
  return MathAnswer(None, False)


def gsm8k_gold(answer_text: str) -> str:
  """The gold number of a GSM8K answer field: the text after the last `####`, commas removed.

  >>> gsm8k_gold("48/2 = <<48/2=24>>24 ...\\n#### 1,072")
  '1072'
  """
  found = extract.hash_answer(answer_text)
  if found is None:
    raise ValueError(
      f"GSM8K answer has no '#### <number>' line: {answer_text[-80:]!r}; pass the dataset's "
      "'answer' field unchanged."
    )
  return found


def _clean(answer: str) -> str:
  answer = answer.strip()
  # Thin spaces used as thousands separators: 1\,234 -> 1234 (math-verify reads "1\,234" as 235).
  answer = re.sub(r"([0-9])(?:\\[,!;: ]|\{,\})(?=[0-9]{3}\b)", r"\1", answer)
  return answer.rstrip(".").strip()


def answers_equal(gold: str, pred: str, *, timeout_s: float = 5.0) -> bool:
  """Whether `pred` is mathematically equivalent to `gold` (see the module docstring)."""
  pred = _clean(pred)
  if not pred or len(pred) > extract.MAX_ANSWER_CHARS or extract.brace_depth(pred) > 32:
    return False
  gold = _clean(gold)
  gold_number, pred_number = extract.plain_number(gold), extract.plain_number(pred)
  if gold_number is not None and pred_number is not None:
    if Fraction(gold_number) == Fraction(pred_number):
      return True
    if "." not in gold_number and "." not in pred_number:
      return False  # two different integers: no rounding question for math-verify to settle
  return verifier.math_equal(gold, pred, timeout_s=timeout_s)


def _gold(example: dict, field: str = "answer") -> str:
  if field not in example or example[field] is None or str(example[field]).strip() == "":
    raise KeyError(f"math reward: example has no gold {field!r} (keys: {sorted(example)}).")
  gold = str(example[field])
  boxed = extract.last_boxed(gold) if "\\boxed" in gold or "\\fbox" in gold else None
  return boxed if boxed is not None else gold.strip()


def _score(gold, completion, fallback, format_reward, timeout_s, hash_fallback) -> float:
  answer = extract_math_answer(completion, hash_fallback=hash_fallback, fallback=fallback)
  if answer.text is None:
    return 0.0
  if answers_equal(gold, answer.text, timeout_s=timeout_s):
    return 1.0
  return float(format_reward) if answer.formatted else 0.0


def math_reward(
  completion: str,
  example: dict,
  *,
  hash_fallback: bool = False,
  fallback: str | None = None,
  format_reward: float = 0.1,
  timeout_s: float = 5.0,
) -> float:
  """1.0 / format_reward / 0.0 against `example["answer"]` (a `\\boxed{}` gold is unwrapped);
  `\\boxed{}` answers only unless `hash_fallback`."""
  gold = _gold(example)
  return _score(gold, completion, fallback, format_reward, timeout_s, hash_fallback)


def math_correct(
  completion: str, example: dict, *, fallback: str | None = None, timeout_s: float = 5.0
) -> bool:
  """Whether the boxed answer, else the `####` number, is equivalent to `example["answer"]`."""
  return _score(_gold(example), completion, fallback, 0.0, timeout_s, True) == 1.0


def _gsm8k_gold_of(example: dict) -> str:
  gold = _gold(example)
  return gsm8k_gold(gold) if "####" in gold else gold


def gsm8k_reward(
  completion: str,
  example: dict,
  *,
  hash_fallback: bool = False,
  fallback: str | None = None,
  format_reward: float = 0.1,
  timeout_s: float = 5.0,
) -> float:
  """`math_reward` with the gold taken after `####` in `example["answer"]` (or used as is)."""
  gold = _gsm8k_gold_of(example)
  return _score(gold, completion, fallback, format_reward, timeout_s, hash_fallback)


def gsm8k_correct(
  completion: str, example: dict, *, fallback: str | None = None, timeout_s: float = 5.0
) -> bool:
  """Whether the boxed answer, else the `####` number, equals the GSM8K gold number."""
  return _score(_gsm8k_gold_of(example), completion, fallback, 0.0, timeout_s, True) == 1.0


def math_answer_key(completion: str, *, fallback: str | None = None) -> str | None:
  """A normalised answer for majority voting (Maj@k): numbers canonicalised, LaTeX spacing and
  `\\left`/`\\right`/`\\dfrac` variants removed. None when no answer was found."""
  text = extract_math_answer(completion, fallback=fallback).text
  if text is None:
    return None
  text = _clean(text)
  number = extract.plain_number(text)
  if number is not None:
    return number
  text = re.sub(r"\\(?:left|right|displaystyle|[,!;: ])", "", text)
  text = re.sub(r"\\[dt]frac", r"\\frac", text)
  return re.sub(r"\s+", "", text)
