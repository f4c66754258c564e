"""Short-answer QA reward (HotpotQA): exact match and token F1 with SQuAD-style normalisation.

The prediction is the last `<answer>...</answer>` (failing that, the last `\\boxed{}`).
Normalisation (SQuAD v1.1 evaluation): lower-case, drop punctuation, drop the articles a/an/the,
collapse whitespace. F1 is the harmonic mean of token precision and recall over the normalised
token multisets; as in the HotpotQA evaluation script, when either side is yes/no/noanswer the
F1 is 0 unless the two normalised strings are equal. Gold may be one string or a list of
aliases (the best score counts). Reward = EM by default (`metric="f1"` for F1).
"""

import re
import string
from collections import Counter

from es_jax.rewards import extract

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")
METRICS = ("em", "f1")


def normalize_answer(text: str) -> str:
  """SQuAD normalisation: lower, no punctuation, no articles, single spaces."""
  text = text.lower().translate(_PUNCTUATION)
  return " ".join(_ARTICLES_RE.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
  """1.0 if the normalised strings are equal, else 0.0."""
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
  """Token-level F1 between normalised prediction and gold (HotpotQA yes/no rule applied)."""
  pred, ref = normalize_answer(prediction), normalize_answer(gold)
  if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
    return 0.0
  common = Counter(pred.split()) & Counter(ref.split())
  overlap = sum(common.values())
  if overlap == 0:
    return 0.0
  precision, recall = overlap / len(pred.split()), overlap / len(ref.split())
  return 2 * precision * recall / (precision + recall)


def extract_qa_answer(completion: str) -> str | None:
  """The last `<answer>` content, else the last `\\boxed{}` content, else None."""
  answer = extract.last_tag(completion, "answer")
  return answer if answer is not None else extract.last_boxed(completion)


def _golds(example: dict) -> list[str]:
  gold = example.get("answer")
  golds = [gold] if isinstance(gold, str) else list(gold or [])
  if not golds or not all(isinstance(g, str) for g in golds):
    raise ValueError(
      f"qa reward: example['answer']={gold!r} must be a string or a list of strings."
    )
  return golds


def qa_reward(completion: str, example: dict, *, metric: str = "em") -> float:
  """EM (default) or F1 of the extracted answer against `example["answer"]`; 0.0 if none."""
  if metric not in METRICS:
    raise ValueError(f"qa_reward: metric={metric!r} is not one of {METRICS}.")
  golds = _golds(example)
  answer = extract_qa_answer(completion)
  if answer is None:
    return 0.0
  score = exact_match if metric == "em" else f1_score
  return max(score(answer, gold) for gold in golds)


def qa_correct(completion: str, example: dict) -> bool:
  """Exact match."""
  return qa_reward(completion, example, metric="em") == 1.0


def qa_answer_key(completion: str) -> str | None:
  """The normalised answer, for majority voting."""
  answer = extract_qa_answer(completion)
  return None if answer is None else normalize_answer(answer)
