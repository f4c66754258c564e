"""Rewards and verifiers: `(completion: str, example: dict) -> float`, maximised.

| name            | module       | example fields                    | reward                  |
|-----------------|--------------|-----------------------------------|-------------------------|
| `math`          | math.py      | answer                            | 1 / 0.1 boxed-wrong / 0 |
| `gsm8k`         | math.py      | answer (with "#### n", or just n) | 1 / 0.1 / 0             |
| `math_hash`     | math.py      | answer                            | as `math`, or "#### n"  |
| `gsm8k_hash`    | math.py      | as `gsm8k`                        | as `gsm8k`, or "#### n" |
| `countdown`     | countdown.py | nums, target                      | 0.1·format + answer     |
| `choice`        | choice.py    | answer (a letter)                 | 1 / 0.1 / 0             |
| `qa`            | qa.py        | answer (string or aliases)        | EM (or F1)              |
| `code`          | code.py      | test_list, [test_setup_code]      | 1 if all asserts pass   |
| `reasoning_gym` | gym_tasks.py | answer, metadata.source_dataset   | the task's score_answer |
| `char_parity`   | synthetic.py | (none)                            | share of odd characters |

The math training rewards read `\\boxed{}` answers only (the paper's reward); the `_hash`
names opt into GSM8K's "#### n" as a formatted answer too (data.reward="gsm8k_hash"). Evaluation
(`is_correct`, `answer_key`) takes the boxed answer, falling back to "#### n", under every name.

A user's reward is named "module:function" (an importable module) or "path/to/file.py:function":
a callable `(completion: str, example: dict) -> float`, maximised; a sample counts as correct in
evaluation when it scores >= 1.0, and abstains from Maj@k voting. It runs in a worker process
under a contract (a copy of the example, a finite number back, a time limit; `user.py`), and
takes one option, `timeout_s`.

Dataset names map onto these (`aime24` → math, `mbpp` → code, `hotpotqa` → qa, ...; see
`TASK_REWARDS`). Every verifier bounds its time on hostile input: extraction is linear in the
completion, answers over 1,000 characters are not parsed, symbolic checks run in a killable worker
process (`verifier.py`) and code in a sandboxed process (`code.py`). A check that misses its
deadline or crashes scores 0 and is counted (`failure_metrics`, logged by the runners).
"""

import functools
import inspect
from collections.abc import Callable

from es_jax.rewards.choice import choice_answer_key, choice_correct, choice_reward
from es_jax.rewards.code import code_correct, code_reward, extract_code, run_sandboxed
from es_jax.rewards.countdown import countdown_answer_key, countdown_correct, countdown_reward
from es_jax.rewards.gym_tasks import (
  reasoning_gym_answer_key,
  reasoning_gym_correct,
  reasoning_gym_reward,
)
from es_jax.rewards.math import (
  answers_equal,
  gsm8k_correct,
  gsm8k_gold,
  gsm8k_reward,
  math_answer_key,
  math_correct,
  math_reward,
)
from es_jax.rewards.qa import exact_match, f1_score, qa_answer_key, qa_correct, qa_reward
from es_jax.rewards.synthetic import (
  char_parity_answer_key,
  char_parity_correct,
  char_parity_reward,
)
from es_jax.rewards.user import RewardError, UserReward, is_user_reward, user_reward
from es_jax.rewards.verifier import failure_counts

REWARDS: dict[str, Callable[..., float]] = {
  "math": math_reward,
  "gsm8k": gsm8k_reward,
  "math_hash": functools.partial(math_reward, hash_fallback=True),
  "gsm8k_hash": functools.partial(gsm8k_reward, hash_fallback=True),
  "countdown": countdown_reward,
  "choice": choice_reward,
  "qa": qa_reward,
  "code": code_reward,
  "reasoning_gym": reasoning_gym_reward,
  "char_parity": char_parity_reward,  # smoke runs: varies on a random model (synthetic.py)
}
_CORRECT = {
  "math": math_correct,
  "gsm8k": gsm8k_correct,
  "math_hash": math_correct,
  "gsm8k_hash": gsm8k_correct,
  "countdown": countdown_correct,
  "choice": choice_correct,
  "qa": qa_correct,
  "code": code_correct,
  "reasoning_gym": reasoning_gym_correct,
  "char_parity": char_parity_correct,
}
_ANSWER_KEY = {
  "math": math_answer_key,
  "gsm8k": math_answer_key,
  "math_hash": math_answer_key,
  "gsm8k_hash": math_answer_key,
  "countdown": countdown_answer_key,
  "choice": choice_answer_key,
  "qa": qa_answer_key,
  "code": lambda completion: None,  # programs are not voted on: Maj@k abstains
  "reasoning_gym": reasoning_gym_answer_key,
  "char_parity": char_parity_answer_key,
}
# Dataset names (es_jax.data) → reward names.
TASK_REWARDS = {
  **{name: name for name in REWARDS},
  "deepscaler": "math",
  "math500": "math",
  "aime24": "math",
  "aime25": "math",
  "amc23": "math",
  "csqa": "choice",
  "gpqa": "choice",
  "hotpotqa": "qa",
  "mbpp": "code",
}


def _user_correct(completion: str, example: dict, *, fn: Callable) -> bool:
  return fn(completion, example) >= 1.0


def _resolve(name: str) -> str:
  if name.startswith("reasoning_gym/"):  # es_jax.data's generated tasks: "reasoning_gym/<task>"
    return "reasoning_gym"
  if name not in TASK_REWARDS:
    raise ValueError(f"Unknown reward or task {name!r}; known: {sorted(TASK_REWARDS)}.")
  return TASK_REWARDS[name]


def _bind(fn: Callable, name: str, options: dict, args: tuple = ("", {})) -> Callable:
  try:
    inspect.signature(fn).bind_partial(*args, **options)
  except TypeError as e:
    raise ValueError(f"{name!r} does not take options {sorted(options)}: {e}.") from None
  return functools.partial(fn, **options) if options else fn


def get_reward(name: str, **options) -> Callable[[str, dict], float]:
  """The reward for a reward or dataset name, with keyword options bound.

  >>> get_reward("gsm8k", fallback="last_number")("so 42", {"answer": "... #### 42"})
  1.0
  """
  if is_user_reward(name):
    return user_reward(name, **options)
  reward = _resolve(name)
  return _bind(REWARDS[reward], name, options)


def is_correct(completion: str, example: dict, *, task: str, **options) -> bool:
  """Whether the completion's answer is correct (evaluation; no format credit; a user's reward:
  a score >= 1.0)."""
  if is_user_reward(task):
    return _user_correct(completion, example, fn=get_reward(task, **options))
  reward = _resolve(task)
  return bool(_bind(_CORRECT[reward], task, options)(completion, example))


def failure_metrics() -> dict[str, int]:
  """Training metrics: reward checks scored 0 after a missed deadline or a crash, cumulative in
  this process (`reward/timeouts_total`, `reward/errors_total`)."""
  return {f"reward/{kind}_total": n for kind, n in failure_counts().items()}


def answer_key(completion: str, *, task: str, **options) -> str | None:
  """A normalised answer for Maj@k voting (None = no answer, abstains; always for a user's
  reward)."""
  if is_user_reward(task):
    return None
  reward = _resolve(task)
  return _bind(_ANSWER_KEY[reward], task, options, args=("",))(completion)


__all__ = [
  "REWARDS",
  "RewardError",
  "TASK_REWARDS",
  "UserReward",
  "answer_key",
  "answers_equal",
  "char_parity_reward",
  "choice_reward",
  "code_reward",
  "countdown_reward",
  "exact_match",
  "extract_code",
  "f1_score",
  "failure_counts",
  "failure_metrics",
  "get_reward",
  "gsm8k_gold",
  "gsm8k_reward",
  "is_correct",
  "is_user_reward",
  "math_reward",
  "qa_reward",
  "reasoning_gym_reward",
  "run_sandboxed",
  "user_reward",
]
