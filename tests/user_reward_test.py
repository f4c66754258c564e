"""A user's reward under its contract (es_jax.rewards.user): in the library, and end to end through
`python -m experiments.main` on custom.py:smoke (a random tiny model), where every hostile reward
ends the run with a non-zero status and one `error:` line naming the reward and the example."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from run_configs import cli_env, with_fields

from es_jax import rewards
from es_jax.rewards import RewardError
from experiments.configs import custom
from experiments.evaluation import evaluate
from experiments.infra.logger import read_metrics
from experiments.runners import run_context, run_data
from experiments.schema.check import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = """
import os, sys, time


def fine(completion, example):
  return len(completion) % 2 == 0  # a bool is a number


def mutate(completion, example):
  whole = example.get("answer") is not None
  example.clear()  # must not reach the run: a later call would see no answer and return NaN
  return 1.0 if whole else float("nan")


def text(completion, example):
  return "1.0"


def none(completion, example):
  return None


def nan(completion, example):
  return float("nan")


def inf(completion, example):
  return float("inf")


def a_list(completion, example):
  return [1.0]


def boom(completion, example):
  return 1 / 0


def exits(completion, example):
  sys.exit(0)


def hard_exit(completion, example):
  os._exit(0)


def interrupt(completion, example):
  raise KeyboardInterrupt


def forever(completion, example):
  time.sleep(10_000)


def late_text(completion, example):
  return 0.0 if completion == "" else "1.0"  # passes the check before the model loads
"""
EXIT_AT_IMPORT = "import sys\nsys.exit(0)\n\n\ndef score(completion, example):\n  return 1.0\n"
HARD_EXIT_AT_IMPORT = "import os\nos._exit(0)\n\n\ndef score(completion, example):\n  return 1.0\n"
ROWS = [{"question": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(1, 5)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """A directory with hostile.py, the two exit-at-import files, train.jsonl and test.jsonl."""
  root = tmp_path_factory.mktemp("user_reward")
  (root / "hostile.py").write_text(HOSTILE)
  (root / "exit_at_import.py").write_text(EXIT_AT_IMPORT)
  (root / "hard_exit_at_import.py").write_text(HARD_EXIT_AT_IMPORT)
  for name in ("train.jsonl", "test.jsonl"):
    (root / name).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  return root


# ------------------------------------------------------------------------------- in the library

_EX = {"id": "t.jsonl:7", "question": "What is 1 + 1?", "answer": "2"}


def _reward(files, name, timeout_s=5.0):
  return rewards.get_reward(f"{files / 'hostile.py'}:{name}", timeout_s=timeout_s)


def test_a_reward_gets_a_copy_and_returns_floats(files):
  example = dict(_EX)
  mutate = _reward(files, "mutate")
  assert [mutate("x", example) for _ in range(3)] == [1.0, 1.0, 1.0]
  assert example == _EX  # cleared in the worker only
  fine = _reward(files, "fine")
  assert fine("ab", example) == 1.0 and fine("a", example) == 0.0
  assert type(fine("ab", example)) is float


@pytest.mark.parametrize(
  "name, said",
  [
    ("text", "returned '1.0' (str)"),
    ("none", "returned None (NoneType)"),
    ("nan", "returned nan (float)"),
    ("inf", "returned inf (float)"),
    ("a_list", "returned [1.0] (list)"),
    ("boom", "raised ZeroDivisionError: division by zero"),
    ("exits", "raised SystemExit: 0"),
    ("interrupt", "raised KeyboardInterrupt"),
    ("hard_exit", "process ended with exit status 0"),
  ],
)
def test_a_broken_contract_is_one_line_naming_reward_example_and_completion(files, name, said):
  reward = _reward(files, name)
  with pytest.raises(RewardError, match=re.escape(said)) as raised:
    reward("The answer is 2, surely, and here is more text", _EX)
  message = str(raised.value)
  assert "\n" not in message and f"hostile.py:{name}'" in message
  assert (
    "example 't.jsonl:7'" in message and "'The answer is 2, surely, and here is mor…'" in message
  )
  if name == "boom":
    assert "1 / 0" in raised.value.traceback  # the user's traceback, for --verbosity=1
  assert _reward(files, "fine")("ab", _EX) == 1.0  # other rewards are unaffected


def test_a_stuck_reward_is_stopped_at_its_time_limit_and_the_next_call_works(files):
  reward = _reward(files, "forever", timeout_s=1.0)
  start = time.monotonic()
  with pytest.raises(RewardError, match="no answer within the time limit of 1 s") as raised:
    reward("", _EX)
  assert raised.value.timed_out and time.monotonic() - start < 10
  with pytest.raises(RewardError, match="time limit"):  # a fresh worker, stuck again
    reward("", _EX)


def test_exits_at_import_are_errors_naming_the_reward(files):
  for file, said in (
    ("exit_at_import.py", "failed: SystemExit: 0"),
    ("hard_exit_at_import.py", "process ended with exit status 0"),
  ):
    with pytest.raises(RewardError, match=said) as raised:
      rewards.get_reward(f"{files / file}:score")
    assert f"{file}:score'" in str(raised.value)


def test_evaluation_scores_a_user_reward_with_the_configs_time_limit(files, monkeypatch):
  monkeypatch.chdir(files)
  config = with_fields(
    custom.get_config("smoke"),
    data__path="train.jsonl",
    eval__path="test.jsonl",
    data__reward="hostile.py:fine",
    data__reward_timeout=7.0,
    progress=False,
  )
  evaluator = evaluate.Evaluator(config, None, run_data.run_keys(0))  # no model needed
  correct, example = evaluator.correct_fn, evaluator.examples[0]
  assert correct("ab", example) is True and correct("a", example) is False
  assert correct.keywords["timeout_s"] == 7.0
  broken = with_fields(config, data__reward="hostile.py:text")
  with pytest.raises(ConfigError, match=r"config\.data\.reward: .*example 'test\.jsonl:1'"):
    evaluate.Evaluator(broken, None, run_data.run_keys(0))


# ------------------------------------------------------------------------- through the command line

# Budgets only: one ES step on two prompts, two evaluation problems.
TINY = [
  "--config.progress=False",
  "--config.es.num_steps=1",
  "--config.eval.every=0",
  "--config.eval.limit=2",
  "--config.data.limit=4",
  "--config.export_hf=False",
]


def _main(files, workdir, reward, *extra):
  env = cli_env(PYTHONPATH=ROOT)  # the session's compilation cache and XLA level
  command = [
    sys.executable,
    "-m",
    "experiments.main",
    "--config",
    os.path.join(ROOT, "experiments", "configs", "custom.py:smoke"),
    "--workdir",
    str(workdir),
    "--config.data.path=train.jsonl",
    "--config.eval.path=test.jsonl",
    f"--config.data.reward={reward}",
    *TINY,
    *extra,
  ]
  # cwd: the files as the command names them; the timeout is a hang guard only.
  return subprocess.run(command, cwd=files, env=env, capture_output=True, text=True, timeout=900)


def _error_line(out) -> str:
  """The run's one `error:` line (no traceback), after checking it failed."""
  assert out.returncode != 0, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, out.stderr[-3000:]
  return errors[0]


REFUSALS = [
  ("hostile.py:text", "returned '1.0' (str)"),
  ("hostile.py:none", "returned None"),
  ("hostile.py:nan", "returned nan"),
  ("hostile.py:inf", "returned inf"),
  ("hostile.py:a_list", "returned [1.0] (list)"),
  ("hostile.py:boom", "raised ZeroDivisionError"),
  ("hostile.py:exits", "raised SystemExit: 0"),
  ("hostile.py:hard_exit", "exit status 0 instead of answering"),
  ("hostile.py:forever", "time limit of 1 s"),
  ("exit_at_import.py:score", "SystemExit: 0"),
  ("hard_exit_at_import.py:score", "exit status 0 instead of answering"),
]


@pytest.mark.parametrize("reward, said", REFUSALS)
def test_hostile_rewards_fail_the_checks_made_before_the_model_loads(
  files, monkeypatch, reward, said
):
  """run_context.cheap_checks, what a run calls before loading its model, in this process (the
  reward runs in its own worker); the command line's exit status and one line: the test below."""
  monkeypatch.chdir(files)
  config = with_fields(
    custom.get_config("smoke"),
    data__path="train.jsonl",
    eval__path="test.jsonl",
    data__reward=reward,
    data__reward_timeout=1.0,
    progress=False,
  )
  with pytest.raises(ConfigError) as raised:
    run_context.cheap_checks(config, run_data.run_keys(0))
  line = str(raised.value)
  assert line.startswith("config.data.reward: ") and "\n" not in line
  assert said in line and f"reward '{reward}'" in line
  if "import" not in reward:
    assert "example 'train.jsonl:1'" in line


# Through the command line: a missed deadline (main adds the field that sets it) and a worker
# that ends at import.
@pytest.mark.parametrize("reward, said", [REFUSALS[8], REFUSALS[-1]])
def test_hostile_rewards_end_the_run_non_zero_before_the_model_loads(files, tmp_path, reward, said):
  out = _main(files, tmp_path / "run", reward, "--config.data.reward_timeout=1")
  line = _error_line(out)
  assert out.returncode == 2 and said in line and f"reward '{reward}'" in line
  assert line.startswith("error: config.data.reward: ")
  assert "loaded in" not in out.stderr  # no model was loaded (the cheap checks come first)
  if reward == "hostile.py:forever":
    assert "--config.data.reward_timeout sets the limit" in line


def test_verbosity_1_shows_the_rewards_traceback(files, tmp_path):
  out = _main(files, tmp_path / "run", "hostile.py:boom", "--verbosity=1")
  assert out.returncode != 0
  assert "The reward's traceback" in out.stderr and "1 / 0" in out.stderr


@pytest.mark.slow
def test_a_reward_breaking_the_contract_mid_run_ends_it_non_zero(files, tmp_path):
  out = _main(files, tmp_path / "run", "hostile.py:late_text")
  line = _error_line(out)
  assert "loaded in" in out.stderr  # it passed the early check: the training call refused it
  assert "reward 'hostile.py:late_text' on example 'train.jsonl:" in line
  assert "returned '1.0' (str)" in line and not (tmp_path / "run" / "DONE").exists()


@pytest.mark.slow
def test_a_mutating_reward_cannot_change_the_examples_of_a_run(files, tmp_path):
  # Each prompt of the step is scored for every one of the 4 population members, on one example
  # dict: a cleared example reaching a later call would score NaN and end the run.
  out = _main(files, tmp_path / "run", "hostile.py:mutate", "--config.eval.final=False")
  assert out.returncode == 0, out.stderr[-3000:]
  (row,) = [r for r in read_metrics(tmp_path / "run") if "train/reward" in r]
  assert row["train/reward"] == 1.0  # every call saw the answer
