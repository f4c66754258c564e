"""reasoning-gym rewards: the task's own `score_answer`, applied to an extracted answer.

The example is a reasoning-gym entry ({"question", "answer", "metadata"}), whose
`metadata["source_dataset"]` names the task (e.g. "chain_sum"). The answer handed to the scorer is
the last `\\boxed{}`, else the last `<answer>...</answer>`, else (with the default
`fallback="last_number"`) the last number in the completion: we measured that SmolLM2-135M
boxes about 1% of the time, so without the fallback the demo's rewards are almost all zero. The
scorer's value is returned unchanged (some tasks give partial credit, e.g. countdown's 0.01/0.05).

Scoring runs in the verifier worker (`es_jax.rewards.verifier`), not in this process: several
reasoning-gym scorers `eval` or `sympy.parse_expr` the answer, which a hostile or merely huge
answer (`9**9**9`) turns into a hang; the worker makes both parse data only. Examples that went
through TFDS may carry bytes and a JSON-encoded metadata string; both are decoded here.
"""

import json

from es_jax.rewards import extract, verifier

FALLBACKS = (None, "last_number")


def extract_gym_answer(completion: str, *, fallback: str | None = "last_number") -> str | None:
  """Last `\\boxed{}`, else last `<answer>` tag, else (optionally) the last number."""
  if fallback not in FALLBACKS:
    raise ValueError(f"fallback={fallback!r} is not one of {FALLBACKS}.")
  answer = extract.last_boxed(completion)
  if answer is None:
    answer = extract.last_tag(completion, "answer")
  if answer is None and fallback == "last_number":
    answer = extract.last_number(completion)
  return answer


def _decode(value):
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, dict):
    return {_decode(k): _decode(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_decode(v) for v in value)
  return value


def as_entry(example: dict) -> tuple[str, dict]:
  """(task name, reasoning-gym entry) from an example, decoding bytes and JSON metadata."""
  entry = _decode(dict(example))
  metadata = entry.get("metadata")
  if isinstance(metadata, str):
    metadata = json.loads(metadata)
    entry["metadata"] = metadata
  if not isinstance(metadata, dict) or "source_dataset" not in metadata:
    raise KeyError(
      "reasoning_gym reward: example['metadata']['source_dataset'] is missing; keep the entry's "
      f"metadata when building the dataset (example keys: {sorted(example)})."
    )
  return metadata["source_dataset"], entry


def reasoning_gym_reward(
  completion: str, example: dict, *, fallback: str | None = "last_number", timeout_s: float = 5.0
) -> float:
  """reasoning-gym's `score_answer(extracted answer, entry)`; 0.0 if the scorer fails."""
  name, entry = as_entry(example)
  answer = extract_gym_answer(completion, fallback=fallback)
  return verifier.reasoning_gym_score(name, answer, entry, timeout_s=timeout_s)


def reasoning_gym_correct(
  completion: str, example: dict, *, fallback: str | None = "last_number", timeout_s: float = 5.0
) -> bool:
  """Whether the score is full credit (1.0)."""
  return reasoning_gym_reward(completion, example, fallback=fallback, timeout_s=timeout_s) >= 1.0


def reasoning_gym_answer_key(
  completion: str, *, fallback: str | None = "last_number"
) -> str | None:
  """The extracted answer (stripped), for majority voting."""
  answer = extract_gym_answer(completion, fallback=fallback)
  return None if answer is None else answer.strip()
