"""es_jax.rewards under hostile model output: bounded time on adversarial inputs, linear-time
extraction on million-character inputs, killed slow checks, and garbage scored without raising."""

import threading
import time

import pytest

from es_jax import rewards
from es_jax.rewards import extract, verifier
from es_jax.rewards.code import Limits

# Slack on top of a verifier's own limit before a time bound counts as broken (shared 2-core CI).
SLACK_S = 3.0
_CD = {"nums": [2, 3, 4], "target": 10}  # a countdown example (as in rewards_test.py)


# ------------------------------------------------------------------------------------ hostile input

_HOSTILE = [
  "x" * 100_000 + r"\boxed{4}",
  r"\boxed{" * 20_000,
  r"\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}",
  r"\boxed{" + "{" * 30 + "1" + "}" * 30 + "}",
  r"\boxed{9^{9^{9}}}",
  r"\boxed{10^{10^{10}}}",
  r"\boxed{(10^{1000000})!}",
  r"\boxed{" + "9" * 999 + "}",
  "9**9**9 " * 10_000,
  "\u202e\u200b\ud800 \\boxed{\u0664\u0662} \U0001f600" * 1000,
  "<answer>" + "(" * 99 + "2" + ")" * 99 + "</answer>",
  "<answer>" + "9" * 60 + "*" + "9" * 60 + "</answer>",
  "```python\n" * 5000,
]


@pytest.mark.parametrize("index", range(len(_HOSTILE)))
def test_hostile_inputs_finish_in_bounded_time(index):
  completion, timeout_s = _HOSTILE[index], 2.0
  checks = [
    lambda: rewards.math_reward(completion, {"answer": "4"}, timeout_s=timeout_s),
    lambda: rewards.gsm8k_reward(completion, {"answer": "#### 4"}, fallback="last_number"),
    lambda: rewards.choice_reward(completion, {"answer": "A"}),
    lambda: rewards.qa_reward(completion, {"answer": "4"}, metric="f1"),
    lambda: rewards.countdown_reward(completion, _CD),
    lambda: rewards.extract_code(completion),
  ]
  for check in checks:
    # A check that hit the deadline killed the worker; start the next one outside the timing
    # (the first call after a kill also waits for the restart, bounded by startup_timeout_s).
    verifier.math_equal("1", "2")
    start = time.monotonic()
    check()
    assert time.monotonic() - start < timeout_s + SLACK_S


def test_hostile_reasoning_gym_answer_is_killed_not_hung():
  # reasoning-gym's countdown scorer runs sympy.parse_expr on the answer: 9**9**9 never returns.
  entry = {
    "answer": "1+2",
    "metadata": {"source_dataset": "countdown", "numbers": [1, 2], "target": 3},
  }
  assert rewards.reasoning_gym_reward(r"\boxed{1+2}", entry) == 1.0
  start = time.monotonic()
  assert rewards.reasoning_gym_reward(r"\boxed{9**9**9}", entry, timeout_s=1.0) < 1.0
  assert time.monotonic() - start < 1.0 + SLACK_S


def test_verifier_kills_a_slow_check_and_recovers_in_any_thread():
  worker = verifier.VerifierProcess()
  try:
    worker.call("math_equal", gold="1", pred="1", inner_timeout=1, timeout_s=30)  # warm up
    start = time.monotonic()
    with pytest.raises(verifier.VerifierError, match="timed out"):
      worker.call("math_equal", gold="10", pred="10^{10^{10}}", inner_timeout=5, timeout_s=0.5)
    assert time.monotonic() - start < 0.5 + SLACK_S
    assert worker.restarts == 1
    result = []
    thread = threading.Thread(
      target=lambda: result.append(
        worker.call("math_equal", gold="x^2+1", pred="1+x^2", inner_timeout=1, timeout_s=30)
      )
    )
    thread.start()
    thread.join()
    assert result == [True]
  finally:
    worker.close()


# ------------------------------------------------------------------------------ linear extraction

_N = 1_000_000
_ADVERSARIAL = {
  "hash_then_spaces": "####" + " " * _N,  # was O(n^2): two adjacent \s* in the #### pattern
  "hash_dollar_spaces": "#### $" + " " * _N,
  "hashes": "#### -$ " * (_N // 8),
  "boxed_then_spaces": "\\boxed" + " " * _N + "x",
  "spaced_boxes": "\\boxed " * (_N // 7),
  "open_boxes": "\\boxed{" * (_N // 7),
  "open_braces": "{" * _N,
  "digits": "1" * _N,
  "bad_thousands": "1," * (_N // 2),
  "answer_tags": "<answer>" * (_N // 8) + "</answer>" * (_N // 9),
  "think_answer": "</think>\n<answer>" * (_N // 17),
  "text_wrappers": "\\text{" * (_N // 6),
  "fences": "```python\n" * (_N // 10),
  "thin_spaces": "1\\," * (_N // 3),
}
_EXTRACTORS = [
  extract.last_boxed,
  extract.last_tag,
  extract.hash_answer,
  extract.last_number,
  extract.plain_number,
  lambda t: rewards.answer_key(t, task="math", fallback="last_number"),
  lambda t: rewards.answer_key(t, task="choice"),
  lambda t: rewards.answer_key(t, task="qa"),
  lambda t: rewards.countdown_reward(t, _CD),
  rewards.extract_code,
]


@pytest.mark.parametrize("name", sorted(_ADVERSARIAL))
def test_extraction_is_linear_on_million_char_inputs(name):
  text = _ADVERSARIAL[name]
  for extractor in _EXTRACTORS:
    start = time.monotonic()
    extractor(text)
    assert time.monotonic() - start < 2.0, (name, extractor)


def test_hash_answer_unchanged_and_bounded():
  assert extract.hash_answer("so #### -$ 1,234.50.") == "-1234.50"
  assert extract.hash_answer("#### 5 then #### $ 12") == "12"
  assert extract.hash_answer("####" + " " * 50_000) is None
  assert extract.hash_answer("#### " + "9" * 2000) is None  # over MAX_ANSWER_CHARS


def test_missed_deadline_scores_zero_and_is_counted():
  verifier.math_equal("1", "1")  # warm worker: the deadline below is the check's alone
  before = rewards.failure_counts()["timeouts"]
  start = time.monotonic()
  assert rewards.math_reward(r"\boxed{10^{10^{10}}}", {"answer": "10"}, timeout_s=0.5) == 0.1
  assert time.monotonic() - start < 0.5 + SLACK_S
  assert rewards.failure_metrics()["reward/timeouts_total"] == before + 1
  before = rewards.failure_counts()["timeouts"]
  assert (
    rewards.run_sandboxed("while True: pass", "", limits=Limits(timeout_s=0.5)).status == "timeout"
  )
  assert rewards.failure_counts()["timeouts"] == before + 1


# ----------------------------------------------------------------------------- garbage never raises

_BIG = "9" * 5000  # over Python's 4300-digit int-str conversion limit
_GARBAGE = [
  "",
  _BIG,
  f"<answer>{_BIG}</answer>",
  f"<think>x</think>\n<answer>{_BIG}*{_BIG}</answer>",
  "<answer>" + "9" * 100 + "*" + "9" * 99 + "</answer>",
  f"\\boxed{{{_BIG}}}",
  "\\boxed{" + "9" * 999 + "}",
  f"#### {_BIG}",
  "#### 1" + ",000" * 2000,
  "<answer>" + "(" * 150 + "1" + ")" * 150 + "</answer>",
  "<answer>" + "[" * 400 + "]" * 400 + "</answer>",
  "\\boxed{" + "{" * 200 + "}" * 200 + "}",
  "\\boxed{" + "\\text{" * 100 + "Z" + "}" * 100 + "}",
  "<answer>\x00</answer>\\boxed{\x00}" + "\x00" * 1000,
  "\ud800\udfff<answer>\ud800</answer>\\boxed{\ud800}#### \ud800 1",
  "<answer>1/0</answer>\\boxed{\\frac{1}{0}}",
  "<answer>1e999</answer>\\boxed{nan}",
]
_GARBAGE_EXAMPLES = {
  "math": {"answer": "5"},
  "gsm8k": {"answer": "#### 5"},
  "math_hash": {"answer": "5"},
  "gsm8k_hash": {"answer": "#### 5"},
  "countdown": {"nums": [1, 2], "target": 3},
  "choice": {"answer": "A"},
  "qa": {"answer": ["x", "y"]},
  "reasoning_gym": {"answer": "3", "metadata": {"source_dataset": "chain_sum"}},
}


@pytest.mark.parametrize("task", sorted(_GARBAGE_EXAMPLES))
def test_rewards_score_garbage_without_raising(task):
  example = _GARBAGE_EXAMPLES[task]
  reward = rewards.get_reward(task)
  for completion in _GARBAGE:
    score = reward(completion, example)
    assert isinstance(score, float) and 0.0 <= score <= 1.1, (task, completion[:40], score)
    rewards.answer_key(completion, task=task)
    assert rewards.is_correct(completion, example, task=task) is False


def test_code_reward_scores_garbage_without_raising():
  example = {"test_list": ["assert f() == 1"]}
  for program in (
    "def f():\n  return 1\x00",
    "def f():\n  return '\ud800'",
    f"def f():\n  return {_BIG}",
    "def f():\n  return " + "(" * 300 + "1" + ")" * 300,
    "```python\n" + "[" * 5000,
  ):
    assert rewards.code_reward(program, example) == 0.0, program[:40]
