"""Tests for es_jax.data: GSM8K preparation and bad rows, reasoning-gym, prompts (the other
builders and unreadable rows: tests/data_builders_test.py)."""

import json
import logging
import re

import pytest
import tensorflow_datasets as tfds
from data_files import GSM8K_ROWS, jsonl, load, write

from es_jax import data

# --- GSM8K: gold extraction, order, bad rows ------------------------------------------------------


def test_gsm8k_gold_after_marker_in_file_order(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS))
  examples = load(tmp_path, "gsm8k", "test")
  assert len(examples) == 3 and examples.num_skipped == 0
  assert [e["answer"] for e in examples] == ["4", "1234", "-3.5"]
  assert [e["id"] for e in examples] == ["test-0", "test-1", "test-2"]
  first = examples[0]
  assert first["prompt"] == "What is 2+2?" and first["task"] == "gsm8k"
  assert first["solution"] == "2+2=<<2+2=4>>4"
  assert all(isinstance(v, str) for v in first.values())
  # The prepared data is ordinary TFDS array_record data, readable by name without TensorFlow.
  prepared = examples.source["prepared_dir"]
  assert prepared.startswith(str(tmp_path / "tfds" / "by_source" / "gsm8k" / "src-"))
  source = tfds.data_source("gsm8k", data_dir=prepared.split("/gsm8k/1.0.0")[0])["test"]
  assert len(source) == 3 and source[1]["answer"] == b"1234"


def test_bad_row_raises_with_file_line_and_field(tmp_path):
  rows = [GSM8K_ROWS[0], {"question": "No marker", "answer": "it is 5"}, GSM8K_ROWS[1]]
  path = write(tmp_path / "src/test.jsonl", jsonl(rows))
  with pytest.raises(data.BadRowError) as info:
    load(tmp_path, "gsm8k", "test")
  error = info.value
  assert (error.path, error.line, error.field) == (str(path), 2, "answer")
  assert f"{path}, line 2: field 'answer'" in str(error) and "on_bad_row='skip'" in str(error)
  assert isinstance(error, ValueError)


def test_skip_counts_every_bad_row_and_warns(tmp_path, caplog):
  rows = [
    {"question": "Missing answer"},
    GSM8K_ROWS[0],
    "not json",
    {"question": "Not a number", "answer": "#### many"},
    GSM8K_ROWS[1],
  ]
  text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
  write(tmp_path / "src/train.jsonl", text)
  with caplog.at_level(logging.WARNING, logger="es_jax.data"):
    examples = load(tmp_path, "gsm8k", "train", on_bad_row="skip")
  assert [e["answer"] for e in examples] == ["4", "1234"]
  assert examples.num_skipped == 3
  assert [(b.line, b.field) for b in examples.bad_rows] == [
    (1, "answer"),
    (3, "<row>"),
    (4, "answer"),
  ]
  assert "not a number" in examples.bad_rows[2].reason
  assert any("skipped 3 bad row(s)" in r.getMessage() for r in caplog.records)
  # The policy applies when reading: the same prepared data still raises on request.
  with pytest.raises(data.BadRowError, match="line 1: field 'answer': missing"):
    data.load_task("gsm8k", "train", files=data.DataFiles(str(tmp_path / "tfds")))


def test_split_with_only_bad_rows(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS[:1]))
  write(tmp_path / "src/train.jsonl", jsonl([{"question": "q", "answer": "no gold"}]))
  examples = load(tmp_path, "gsm8k", "train", on_bad_row="skip")
  assert len(examples) == 0 and examples.num_skipped == 1
  with pytest.raises(data.BadRowError, match="train.jsonl, line 1"):
    load(tmp_path, "gsm8k", "train")


def test_changed_source_files_are_prepared_again(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS[:1]))
  assert [e["answer"] for e in load(tmp_path, "gsm8k", "test")] == ["4"]
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS[1:]))
  assert [e["answer"] for e in load(tmp_path, "gsm8k", "test")] == ["1234", "-3.5"]
  # Without source_dir, what is prepared is read as it is.
  assert len(data.load_task("gsm8k", "test", files=data.DataFiles(str(tmp_path / "tfds")))) == 2


@pytest.mark.parametrize("progress", [True, False])
def test_preparing_prints_nothing_and_bars_follow_progress(tmp_path, capsys, monkeypatch, progress):
  # Nothing is downloaded: no TFDS "Downloading ..." / "downloaded and prepared" lines on stdout,
  # no warning about the missing directory; the bars (on a terminal) only with progress=True,
  # and TFDS's global switch is restored after.
  from es_jax.data import prepared

  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS))
  monkeypatch.setattr(prepared.sys.stderr, "isatty", lambda: True, raising=False)
  shown = []
  real = prepared.tfds.display_progress_bar
  monkeypatch.setattr(
    prepared.tfds, "display_progress_bar", lambda on: shown.append(on) or real(on)
  )
  capsys.readouterr()
  with _no_warnings():
    assert len(load(tmp_path, "gsm8k", "test", progress=progress)) == 3
  out = capsys.readouterr()
  assert "download" not in (out.out + out.err).lower()
  assert shown == [progress, True]
  shown.clear()
  load(tmp_path, "gsm8k", "test", progress=progress)  # prepared already: no bars at all
  assert shown == []


class _no_warnings(logging.Handler):
  """Fails on any WARNING logged (absl's included) while active."""

  def __enter__(self):
    logging.getLogger().addHandler(self)
    return self

  def __exit__(self, *exc):
    logging.getLogger().removeHandler(self)

  def emit(self, record):
    if record.levelno >= logging.WARNING:
      raise AssertionError(record.getMessage())


def test_prepared_data_is_keyed_by_source_dir(tmp_path):
  tfds_dir = str(tmp_path / "tfds")
  write(tmp_path / "a/test.jsonl", jsonl(GSM8K_ROWS[:1]))
  write(tmp_path / "b/test.jsonl", jsonl(GSM8K_ROWS[1:]))
  a = data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir, str(tmp_path / "a")))
  assert [e["answer"] for e in a] == ["4"]
  # Without source_dir, the one prepared copy is used.
  assert [e["answer"] for e in data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir))] == [
    "4"
  ]
  b = data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir, str(tmp_path / "b")))
  assert [e["answer"] for e in b] == ["1234", "-3.5"]
  # Preparing b did not touch a's copy, and the examples say where they come from.
  again = data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir, str(tmp_path / "a")))
  assert [e["answer"] for e in again] == ["4"]
  assert again.source["source_dir"] == str(tmp_path / "a") and again.source["rows"] == 1
  assert again.source["files"][0][0] == "test.jsonl" and len(again.source["files"][0][1]) == 64
  assert a.source["prepared_dir"] != b.source["prepared_dir"]
  with pytest.raises(ValueError, match=f"2 source directories.*{tmp_path / 'a'}.*source_dir="):
    data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir))
  # No temporary directory is left behind.
  base = tmp_path / "tfds" / "by_source" / "gsm8k"
  assert sorted(p.name[:2] for p in base.iterdir()) == ["a-", "b-"]


def test_limit_beyond_the_data_warns(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS))
  with pytest.warns(data.DataSmallerThanLimitWarning, match="limit=10 but .* only 3"):
    examples = load(tmp_path, "gsm8k", "test", limit=10)
  assert len(examples) == 3 and examples.source["limit"] == 10 and examples.source["used"] == 3
  assert len(load(tmp_path, "gsm8k", "test", limit=2)) == 2


def test_concurrent_preparations_of_two_sources_do_not_mix(tmp_path):
  import concurrent.futures

  from es_jax.data import prepared

  rows = {d: [{"question": f"{d}{i}", "answer": f"#### {i}"} for i in range(20)] for d in "ab"}
  for d, r in rows.items():
    write(tmp_path / d / "test.jsonl", jsonl(r))
  tfds_dir = str(tmp_path / "tfds")
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    futures = {
      d: pool.submit(prepared.prepare, "gsm8k", data_dir=tfds_dir, source_dir=str(tmp_path / d))
      for d in "ab"
    }
    for f in futures.values():
      f.result()
  for d in "ab":
    examples = data.load_task("gsm8k", "test", files=data.DataFiles(tfds_dir, str(tmp_path / d)))
    assert [e["prompt"] for e in examples] == [r["question"] for r in rows[d]]


def test_unknown_or_missing_things_are_explained(tmp_path):
  with pytest.raises(ValueError, match="unknown task 'gsm9k'.*gsm8k"):
    data.load_task("gsm9k", "test")
  with pytest.raises(FileNotFoundError, match="not prepared.*source_dir=.*test.jsonl"):
    data.load_task("gsm8k", "test", files=data.DataFiles(str(tmp_path / "tfds")))
  (tmp_path / "src").mkdir()
  with pytest.raises(FileNotFoundError, match="no source files in .*train.jsonl"):
    load(tmp_path, "gsm8k", "test")
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS))
  with pytest.raises(ValueError, match="no split 'train'.*prepared: \\['test'\\]"):
    load(tmp_path, "gsm8k", "train")
  with pytest.raises(ValueError, match="on_bad_row must be"):
    load(tmp_path, "gsm8k", "test", on_bad_row="ignore")


def test_task_examples_sequence(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl(GSM8K_ROWS))
  examples = load(tmp_path, "gsm8k", "test", limit=2)
  assert len(examples) == 2
  assert examples[-1]["answer"] == "1234"
  assert [e["answer"] for e in examples[::-1]] == ["1234", "4"]
  with pytest.raises(IndexError, match="gsm8k/test: index 2"):
    examples[2]


# --- reasoning-gym ----------------------------------------------------------------------------

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_reasoning_gym_is_deterministic_and_configurable():
  def load_gym(split="train", seed=0):
    return data.load_task(
      "reasoning_gym/chain_sum", split, limit=12, seed=seed, task_config=CHAIN_SUM
    )

  first = list(load_gym())
  assert len(first) == 12 and first == list(load_gym())
  assert [e["prompt"] for e in first] != [e["prompt"] for e in load_gym(seed=1)]
  assert [e["prompt"] for e in first] != [e["prompt"] for e in load_gym(split="test")]
  for example in first:
    assert re.search(r"(?<!\d)\d [+-] \d =$", example["prompt"]), example["prompt"]
    assert example["task"] == "reasoning_gym/chain_sum"
    assert example["metadata"]["source_dataset"] == "chain_sum"
    a, op, b = example["metadata"]["expression"].split()
    assert example["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
  import reasoning_gym

  score = reasoning_gym.get_score_answer_fn("chain_sum")
  assert score(first[0]["answer"], first[0]) == 1.0


def test_reasoning_gym_errors():
  with pytest.raises(ValueError, match="no task 'chain_sums'.*chain_sum"):
    data.load_task("reasoning_gym/chain_sums", "train", limit=2)
  with pytest.raises(ValueError, match="unknown config keys \\['terms'\\].*max_terms"):
    data.load_task("reasoning_gym/chain_sum", "train", limit=2, task_config={"terms": 2})
  with pytest.raises(ValueError, match="generated, not read from files"):
    data.load_task(
      "reasoning_gym/chain_sum", "train", limit=2, files=data.DataFiles(source_dir="/nonexistent")
    )
  with pytest.raises(ValueError, match="task_config is for reasoning_gym"):
    data.load_task("gsm8k", "test", task_config={"a": 1})


# --- Prompt formatting ------------------------------------------------------------------------

TEMPLATE = (
  "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
  "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
  "supported') }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
  from tokenizers import Tokenizer, models
  from transformers import PreTrainedTokenizerFast

  vocab = {"[UNK]": 0, "hello": 1}
  return PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")), unk_token="[UNK]"
  )


def test_format_prompt_with_chat_template(tokenizer):
  math = {"task": "gsm8k", "prompt": "What is 2+2?"}
  text = data.format_prompt(math, tokenizer, chat_template=TEMPLATE)
  assert text == (
    "<|system|>Please reason step by step, and put your final answer within \\boxed{}.<|end|>\n"
    "<|user|>What is 2+2?<|end|>\n<|assistant|>"
  )
  countdown = {"task": "countdown", "prompt": "Use [1, 2] to make 3."}
  text = data.format_prompt(countdown, tokenizer, chat_template=TEMPLATE)
  assert text.startswith("<|system|>Please reason step by step.<|end|>")
  assert "Use [1, 2] to make 3.\n\nShow your work in <think> </think> tags." in text
  assert "\\boxed" not in text
  text = data.format_prompt(
    math, tokenizer, chat_template=TEMPLATE, system_prompt="", instruction="Be brief."
  )
  assert text == "<|user|>What is 2+2?\n\nBe brief.<|end|>\n<|assistant|>"


def test_format_prompt_merges_system_when_the_template_rejects_it(tokenizer):
  example = {"task": "csqa", "prompt": "Q\n\nA. x\nB. y"}
  text = data.format_prompt(example, tokenizer, chat_template=NO_SYSTEM_TEMPLATE)
  assert text.startswith("<|user|>Please reason step by step, and put your final answer within")
  assert text.endswith("for example \\boxed{A}.\n<|assistant|>")


def test_format_prompt_plain_fallback(tokenizer):
  example = {"task": "hotpotqa", "prompt": "Who?"}
  expected = f"{data.PLAIN_SYSTEM_PROMPT}\n\nWho?\n\n{data.INSTRUCTIONS['hotpotqa']}\n"
  assert tokenizer.chat_template is None
  assert data.format_prompt(example, tokenizer) == expected
  assert data.format_prompt(example, None) == expected
  mbpp = data.build_messages({"task": "mbpp", "prompt": "Write f."})
  assert mbpp[1]["content"].endswith("```python code block.")
  gym = data.build_messages({"task": "reasoning_gym/chain_sum", "prompt": "1 + 2 ="})
  assert gym == [
    {"role": "system", "content": data.SYSTEM_PROMPT},
    {"role": "user", "content": "1 + 2 ="},
  ]


def test_task_names_match_the_builders_and_importing_es_jax_skips_tfds():
  import subprocess
  import sys

  from es_jax.data import builders

  assert data.TASKS == tuple(builders.BUILDERS)
  code = "import sys, es_jax; print('tensorflow_datasets' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False", out.stderr[-2000:]
