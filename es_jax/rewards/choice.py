"""Multiple-choice reward (CommonsenseQA, GPQA): the boxed option letter.

Accepted forms: `\\boxed{C}`, `\\boxed{(C)}`, `\\boxed{\\text{C}}`, `\\boxed{\\text{(C)}}`,
`\\boxed{\\textbf{C.}}`, `\\boxed{C) the answer text}`; failing a box, the last
`<answer>C</answer>`. Letters are case-insensitive. Reward: 1.0 correct, `format_reward` (0.1) for
a box or answer tag without a correct letter, 0.0 when neither exists (the math scheme).
"""

import re

from es_jax.rewards import extract

_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox)\s*\{([^{}]*)\}")
# A lone letter, optionally bracketed, optionally followed by ")", "." or ":" and option text.
_LETTER_RE = re.compile(r"^[\s(\[]*([A-Za-z])\s*(?:[)\].:].*)?$", re.DOTALL)


def choice_letter(answer: str | None) -> str | None:
  """The option letter of an extracted answer ('\\text{(c)}' -> 'C'), or None."""
  if answer is None:
    return None
  previous = None
  while previous != answer:  # unwrap nested \text{\textbf{...}}
    previous, answer = answer, _WRAPPER_RE.sub(r"\1", answer)
  answer = answer.replace("$", "").strip()
  found = _LETTER_RE.match(answer)
  return found.group(1).upper() if found else None


def extract_choice(completion: str) -> tuple[str | None, bool]:
  """(letter or None, whether a box or answer tag was found)."""
  answer = extract.last_boxed(completion)
  if answer is None:
    answer = extract.last_tag(completion, "answer")
  return choice_letter(answer), answer is not None


def _gold_letter(example: dict) -> str:
  gold = choice_letter(str(example.get("answer", "")))
  if gold is None:
    raise ValueError(
      f"choice reward: example['answer']={example.get('answer')!r} is not an option letter; "
      "store the correct option as 'A'..'Z'."
    )
  return gold


def choice_reward(completion: str, example: dict, *, format_reward: float = 0.1) -> float:
  """1.0 / format_reward / 0.0 against the letter in `example["answer"]`."""
  gold = _gold_letter(example)
  letter, formatted = extract_choice(completion)
  if letter == gold:
    return 1.0
  return float(format_reward) if formatted else 0.0


def choice_correct(completion: str, example: dict) -> bool:
  """Whether the extracted letter is the gold letter."""
  return extract_choice(completion)[0] == _gold_letter(example)


def choice_answer_key(completion: str) -> str | None:
  """The letter, for majority voting."""
  return extract_choice(completion)[0]
