"""Tests for es_jax.rewards: verifier tables, countdown, the code sandbox, hostile inputs."""

import json
import os
import socket
import time

import pytest

from es_jax import rewards
from es_jax.rewards import extract
from es_jax.rewards.code import Limits
from es_jax.rewards.countdown import evaluate_expression

# Slack on top of a verifier's own limit before a time bound counts as broken (shared 2-core CI).
SLACK_S = 3.0


# ------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
  "text,want",
  [
    (r"so \boxed{\frac{1}{\sqrt{2}}}.", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{1} then \fbox{2} and \boxed{3}", "3"),
    (r"\boxed{3} then \boxed{4", "3"),  # unclosed last box (truncated) is skipped
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not grouping
    (r"\boxed 5.", "5"),
    ("no box here {}", None),
    (r"\boxed{" + "9" * 1001 + "}", None),  # over MAX_ANSWER_CHARS
  ],
)
def test_last_boxed(text, want):
  assert extract.last_boxed(text) == want


def test_plain_number_and_last_number():
  assert extract.plain_number(r"\$1,234.") == "1234"
  assert extract.plain_number(r"1\,234") == "1234"
  assert extract.plain_number("-0.50") == "-0.5"
  assert extract.plain_number("１２") is None  # full-width digits are not numbers here
  assert extract.plain_number("1,23") is None
  assert extract.last_number("so 5-3 = 2, i.e. x = -4.") == "-4"
  assert extract.last_number("2023-2024") == "2024"
  assert extract.last_tag("<answer>a</answer> <answer> b </answer>") == "b"


# ------------------------------------------------------------------------------------ math


@pytest.mark.parametrize(
  "completion,gold,want",
  [
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1,234}", "1234", 1.0),
    (r"\boxed{1\,234}", "1234", 1.0),
    (r"\boxed{\$18.00}", "18", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{\dfrac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),
    (r"\boxed{2^{10}}", "1024", 1.0),
    (r"\boxed{3} no wait \boxed{4}", "4", 1.0),
    (r"Final: \boxed{7}", r"\boxed{7}", 1.0),  # a boxed gold is unwrapped
    (r"\boxed{3}", "4", 0.1),
    (r"\boxed{\pi}", "3.14", 0.1),
    (r"\boxed{}", "4", 0.1),
    (r"\boxed{4", "4", 0.0),  # unclosed box
    ("The answer is 4", "4", 0.0),  # no box, no fallback
  ],
)
def test_math_reward_table(completion, gold, want):
  assert rewards.math_reward(completion, {"answer": gold}) == want
  assert rewards.is_correct(completion, {"answer": gold}, task="math500") == (want == 1.0)


# The paper's training reward reads \boxed{} only; evaluation falls back to "####" (§1, §5).
# (completion, gold, training reward, *_hash reward, evaluation correct)
_HASH_CASES = [
  (r"so \boxed{72}", "72", 1.0, 1.0, True),
  (r"so \boxed{71}", "72", 0.1, 0.1, False),
  ("so she sold 72.\n#### 72", "72", 0.0, 1.0, True),
  ("so she sold 71.\n#### 71", "72", 0.0, 0.1, False),
  (r"#### 71 then \boxed{72}", "72", 1.0, 1.0, True),  # the box wins over the hash
  (r"\boxed{71} then #### 72", "72", 0.1, 0.1, False),
  ("She sold 72 clips.", "72", 0.0, 0.0, False),
]


@pytest.mark.parametrize("completion,gold,train,hashed,correct", _HASH_CASES)
def test_training_reward_boxed_only_unless_hash_name(completion, gold, train, hashed, correct):
  for task, example in (("math", {"answer": gold}), ("gsm8k", {"answer": f"... #### {gold}"})):
    assert rewards.get_reward(task)(completion, example) == train, task
    assert rewards.get_reward(f"{task}_hash")(completion, example) == hashed, task
    for name in (task, f"{task}_hash"):
      assert rewards.is_correct(completion, example, task=name) is correct, name
  assert rewards.get_reward("deepscaler")(completion, {"answer": gold}) == train
  assert rewards.is_correct(completion, {"answer": gold}, task="math500") is correct


def test_answer_key_falls_back_to_the_hash_number():
  assert rewards.answer_key("so\n#### 1,072", task="gsm8k") == "1072"
  assert rewards.answer_key("so\n#### 1,072", task="math_hash") == "1072"


def test_gsm8k_gold_and_last_number_fallback():
  example = {"answer": "She sold 48/2 = <<48/2=24>>24 ...\n#### 72"}
  assert rewards.gsm8k_gold(example["answer"]) == "72"
  with pytest.raises(ValueError, match="####"):
    rewards.gsm8k_gold("no marker")
  assert rewards.gsm8k_reward(r"\boxed{72}", example) == 1.0
  assert rewards.gsm8k_reward(r"\boxed{72}", {"answer": "72"}) == 1.0  # pre-extracted gold
  assert rewards.gsm8k_reward("So she sold 72 clips.", example) == 0.0
  reward = rewards.get_reward("gsm8k", fallback="last_number")
  assert reward("So she sold 72 clips.", example) == 1.0
  assert reward("So she sold 71 clips.", example) == 0.0  # the fallback earns no format credit
  with pytest.raises(ValueError, match="fallback"):
    rewards.math_reward("x", {"answer": "1"}, fallback="first_number")
  with pytest.raises(KeyError, match="'answer'"):
    rewards.math_reward("x", {"question": "?"})


def test_answer_keys_for_majority_voting():
  assert rewards.answer_key(r"\boxed{1,234.0}", task="math") == "1234"
  assert rewards.answer_key(r"\boxed{\dfrac{1}{2}}", task="math") == r"\frac{1}{2}"
  assert rewards.answer_key(r"\boxed{\left( 1, 2 \right)}", task="aime24") == "(1,2)"
  assert rewards.answer_key("nothing", task="gsm8k") is None
  assert rewards.answer_key("nothing 7", task="gsm8k", fallback="last_number") == "7"
  assert rewards.answer_key(r"\boxed{\text{(b)}}", task="csqa") == "B"
  assert rewards.answer_key("<answer>The Moon.</answer>", task="hotpotqa") == "moon"


def test_registry_errors():
  with pytest.raises(ValueError, match="Unknown reward or task 'gsm9k'"):
    rewards.get_reward("gsm9k")
  with pytest.raises(ValueError, match="does not take options"):
    rewards.get_reward("qa", fallback="last_number")


# ------------------------------------------------------------------------------------ choice, qa


@pytest.mark.parametrize(
  "completion,want",
  [
    (r"\boxed{C}", 1.0),
    (r"\boxed{(C)}", 1.0),
    (r"\boxed{\text{C}}", 1.0),
    (r"\boxed{\text{(C)}}", 1.0),
    (r"\boxed{\textbf{c.}}", 1.0),
    (r"\boxed{C) a river bank}", 1.0),
    ("<answer>C</answer>", 1.0),
    (r"\boxed{D}", 0.1),
    (r"\boxed{Cat}", 0.1),
    ("The answer is C", 0.0),
  ],
)
def test_choice_reward_table(completion, want):
  assert rewards.choice_reward(completion, {"answer": "C"}) == want
  assert rewards.choice_reward(completion, {"answer": "(C)"}) == want


def test_choice_rejects_non_letter_gold():
  with pytest.raises(ValueError, match="not an option letter"):
    rewards.choice_reward(r"\boxed{C}", {"answer": "banana"})


def test_qa_em_and_f1():
  assert rewards.qa_reward("<answer>The Eiffel Tower!</answer>", {"answer": "eiffel tower"}) == 1.0
  assert rewards.qa_reward("<answer>Paris</answer>", {"answer": ["City of Light", "Paris"]}) == 1.0
  example = {"answer": "red dog"}
  completion = "<answer>the big red dog</answer>"
  assert rewards.qa_reward(completion, example) == 0.0
  # Tokens: pred {big, red, dog}, gold {red, dog}: P = 2/3, R = 1, F1 = 0.8.
  assert rewards.qa_reward(completion, example, metric="f1") == pytest.approx(0.8)
  assert rewards.f1_score("yes", "yes indeed") == 0.0  # HotpotQA yes/no rule
  assert rewards.qa_reward("red dog", example) == 0.0  # no answer tags


# ------------------------------------------------------------------------------------ countdown

_CD = {"nums": [2, 3, 4], "target": 10}


@pytest.mark.parametrize(
  "completion,want",
  [
    ("<think>2*3=6</think>\n<answer>2*3+4</answer>", 1.1),  # full format + correct
    ("<answer>(4 + 3 * 2)</answer>", 1.05),  # answer tag only: 0.1 * 0.5 + 1
    ("<think>t</think>\n<answer>2*3*4</answer>", 0.1),  # valid, wrong value
    ("<answer>2*3+2+2</answer>", 0.05),  # reuses 2, skips 4
    ("<answer>3*4-2</answer> <answer>2+4</answer>", 0.05),  # the last answer counts
    ("<answer>2**3+2</answer>", 0.05),  # ** rejected by the AST walker
    ("<answer>2.5*4</answer>", 0.05),  # '.' not allowed
    ("<answer>__import__('os').system('touch /tmp/es_jax_pwned')</answer>", 0.05),
    ("<answer>4/(3-3)+2</answer>", 0.05),  # division by zero
    ("<answer>02*3+4</answer>", 0.05),  # leading zero: not a Python literal
    ("2*3+4", 0.0),
  ],
)
def test_countdown_reward_table(completion, want):
  assert rewards.countdown_reward(completion, _CD) == pytest.approx(want)
  assert not os.path.exists("/tmp/es_jax_pwned")


def test_countdown_exact_rational_arithmetic_and_prefilled_think():
  example = {"nums": [1, 3, 4, 6], "target": 24}
  assert rewards.countdown_reward("<answer>6/(1-3/4)</answer>", example) == pytest.approx(1.05)
  completion = "6/(1/4) = 24</think>\n<answer>6/(1-3/4)</answer>"
  assert rewards.countdown_reward(completion, example, think_prefilled=True) == pytest.approx(1.1)
  assert evaluate_expression("-(1+2)") is not None
  assert evaluate_expression("abs(-2)") is None and evaluate_expression("x") is None
  with pytest.raises(KeyError, match="'nums'"):
    rewards.countdown_reward("<answer>1</answer>", {"target": 1})


# ------------------------------------------------------------------------------------ code sandbox


def test_sandbox_pass_fail_and_early_exit():
  example = {
    "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    "test_setup_code": "import math",
  }
  good = "Here:\n```python\ndef add(a, b):\n  return a + b\n```\nDone."
  assert rewards.code_reward(good, example) == 1.0
  assert rewards.code_reward("def add(a, b):\n  return a - b\n", example) == 0.0
  assert rewards.code_reward("import os\nos._exit(0)", example) == 0.0
  assert rewards.code_reward("import sys\nsys.exit(0)", example) == 0.0
  result = rewards.run_sandboxed("import os\nos.fork()", "")
  assert not result.passed and "fork" in result.output
  shown = "```python\ndef add(a, b):\n  return a + b\n```\nOutput:\n```\n3\n```"
  assert rewards.code_reward(shown, example) == 1.0  # untagged output block ignored
  assert rewards.extract_code("```\nx = 1\n```") == "x = 1\n"


def test_sandbox_kills_infinite_loop_and_memory_hog():
  start = time.monotonic()
  result = rewards.run_sandboxed("while True:\n  pass", "assert True", limits=Limits(timeout_s=1.5))
  assert result.status == "timeout" and not result.passed
  assert time.monotonic() - start < 1.5 + SLACK_S
  result = rewards.run_sandboxed(
    "x = bytearray(4 * 10**9)", "", limits=Limits(memory_bytes=256 << 20)
  )
  assert not result.passed and "MemoryError" in result.output


def test_sandbox_blocks_network():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.2)
  port = server.getsockname()[1]
  program = f"import socket\nsocket.create_connection(('127.0.0.1', {port})).sendall(b'hi')"
  result = rewards.run_sandboxed(program, "", limits=Limits(timeout_s=3))
  assert not result.passed and "socket" in result.output
  with pytest.raises(TimeoutError):  # nothing ever connected
    server.accept()
  server.close()


# ------------------------------------------------------------------------------------ reasoning_gym


def test_reasoning_gym_reward_extraction_and_decoding():
  entry = {"question": "4 - 1 =", "answer": "3", "metadata": {"source_dataset": "chain_sum"}}
  assert rewards.reasoning_gym_reward(r"so \boxed{3}", entry) == 1.0
  assert rewards.reasoning_gym_reward("<answer>3</answer>", entry) == 1.0
  assert rewards.reasoning_gym_reward("4 - 1 is 3.", entry) == 1.0  # last-number fallback
  assert rewards.reasoning_gym_reward("4 - 1 is 3.", entry, fallback=None) == 0.0
  tfds_like = {"answer": b"3", "metadata": json.dumps(entry["metadata"]).encode()}
  assert rewards.reasoning_gym_reward("3", tfds_like) == 1.0
  with pytest.raises(ValueError, match="not a reasoning-gym dataset"):
    rewards.reasoning_gym_reward("3", {"answer": "3", "metadata": {"source_dataset": "nope"}})
  with pytest.raises(KeyError, match="source_dataset"):
    rewards.reasoning_gym_reward("3", {"answer": "3"})
