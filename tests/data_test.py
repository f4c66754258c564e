"""Tests for es_jax.data: TFDS builders on small fixture files, bad rows, reasoning-gym, prompts."""

import csv
import json
import logging
import re

import pytest
import tensorflow_datasets as tfds

from es_jax import data
from es_jax.data import formats, readers


def write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")
  return path


def jsonl(rows):
  return "".join(json.dumps(r) + "\n" for r in rows)


def load(tmp_path, name, split, **kwargs):
  return data.load_task(
    name, split, data_dir=str(tmp_path / "tfds"), source_dir=str(tmp_path / "src"), **kwargs
  )


# --- GSM8K: gold extraction, order, bad rows ------------------------------------------------------

GSM8K_ROWS = [
  {"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
  {"question": "How many?", "answer": "Lots.\n#### 1,234"},
  {"question": "Half of 7?", "answer": "#### -3.5"},
]


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
    data.load_task("gsm8k", "train", data_dir=str(tmp_path / "tfds"))


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
  assert len(data.load_task("gsm8k", "test", data_dir=str(tmp_path / "tfds"))) == 2


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
  a = data.load_task("gsm8k", "test", data_dir=tfds_dir, source_dir=str(tmp_path / "a"))
  assert [e["answer"] for e in a] == ["4"]
  # Without source_dir, the one prepared copy is used.
  assert [e["answer"] for e in data.load_task("gsm8k", "test", data_dir=tfds_dir)] == ["4"]
  b = data.load_task("gsm8k", "test", data_dir=tfds_dir, source_dir=str(tmp_path / "b"))
  assert [e["answer"] for e in b] == ["1234", "-3.5"]
  # Preparing b did not touch a's copy, and the examples say where they come from.
  again = data.load_task("gsm8k", "test", data_dir=tfds_dir, source_dir=str(tmp_path / "a"))
  assert [e["answer"] for e in again] == ["4"]
  assert again.source["source_dir"] == str(tmp_path / "a") and again.source["rows"] == 1
  assert again.source["files"][0][0] == "test.jsonl" and len(again.source["files"][0][1]) == 64
  assert a.source["prepared_dir"] != b.source["prepared_dir"]
  with pytest.raises(ValueError, match=f"2 source directories.*{tmp_path / 'a'}.*source_dir="):
    data.load_task("gsm8k", "test", data_dir=tfds_dir)
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
    examples = data.load_task("gsm8k", "test", data_dir=tfds_dir, source_dir=str(tmp_path / d))
    assert [e["prompt"] for e in examples] == [r["question"] for r in rows[d]]


def test_unknown_or_missing_things_are_explained(tmp_path):
  with pytest.raises(ValueError, match="unknown task 'gsm9k'.*gsm8k"):
    data.load_task("gsm9k", "test")
  with pytest.raises(FileNotFoundError, match="not prepared.*source_dir=.*test.jsonl"):
    data.load_task("gsm8k", "test", data_dir=str(tmp_path / "tfds"))
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


# --- The other builders, one small fixture each --------------------------------------------------


def test_deepscaler_json_list_reports_the_element_line(tmp_path):
  rows = [{"problem": "1+1?", "solution": "2", "answer": "2"}, {"problem": "x?", "solution": "s"}]
  path = write(tmp_path / "src/deepscaler.json", json.dumps(rows, indent=2))
  with pytest.raises(data.BadRowError) as info:
    load(tmp_path, "deepscaler", "train")
  assert (info.value.path, info.value.line, info.value.field) == (str(path), 7, "answer")
  examples = load(tmp_path, "deepscaler", "train", on_bad_row="skip")
  assert [(e["prompt"], e["answer"], e["solution"]) for e in examples] == [("1+1?", "2", "2")]


def test_math500_fields(tmp_path):
  row = dict(problem="Find $x$.", answer="\\frac{1}{2}", subject="Algebra", level=3, solution="s")
  row["unique_id"] = "test/algebra/1.json"
  write(tmp_path / "src/test.jsonl", jsonl([row]))
  (example,) = load(tmp_path, "math500", "test")
  assert example["answer"] == "\\frac{1}{2}" and example["level"] == 3
  assert example["id"] == "test/algebra/1.json" and example["subject"] == "Algebra"


def test_aime_field_aliases_and_integer_gold(tmp_path):
  write(tmp_path / "src/test.jsonl", jsonl([{"ID": "2024-I-1", "Problem": "P?", "Answer": 33}]))
  (example,) = load(tmp_path, "aime24", "test")
  assert (example["id"], example["prompt"], example["answer"]) == ("2024-I-1", "P?", "33")
  # Each dataset has a directory of its own (AIME 2025 comes as two files, read in name order).
  source = tmp_path / "aime25"
  write(source / "aime2025-I.jsonl", jsonl([{"question": "Q1", "answer": "70"}]))
  write(source / "aime2025-II.jsonl", jsonl([{"question": "Q2", "answer": "x+1"}]))
  kwargs = {"data_dir": str(tmp_path / "tfds"), "source_dir": str(source)}
  with pytest.raises(data.BadRowError, match="aime2025-II.jsonl, line 1: field 'answer': AIME"):
    data.load_task("aime25", "test", **kwargs)
  examples = data.load_task("aime25", "test", on_bad_row="skip", **kwargs)
  assert [e["answer"] for e in examples] == ["70"] and examples.num_skipped == 1


def test_amc_numeric_answers(tmp_path):
  write(
    tmp_path / "src/test.jsonl",
    jsonl([{"problem": "A?", "answer": 27.0, "id": 3}, {"question": "B?", "answer": "0.5"}]),
  )
  examples = load(tmp_path, "amc23", "test")
  assert [(e["id"], e["answer"]) for e in examples] == [("3", "27"), ("test-1", "0.5")]


def test_countdown_numbers_round_trip(tmp_path):
  write(
    tmp_path / "src/train.jsonl",
    jsonl([{"nums": [3, 5, 7], "target": 22}, {"nums": [10, 2], "target": 5}]),
  )
  examples = load(tmp_path, "countdown", "train")
  assert examples[0]["nums"] == [3, 5, 7] and examples[0]["target"] == 22
  assert all(type(n) is int for n in examples[0]["nums"])
  assert examples[1]["answer"] == "5"
  assert "Using the numbers [10, 2], create an equation that equals 5" in examples[1]["prompt"]


def test_countdown_parquet(tmp_path):
  pq = pytest.importorskip("pyarrow.parquet")
  pa = pytest.importorskip("pyarrow")
  table = pa.table({"target": [9, 4], "nums": [[4, 5], [2]]})
  (tmp_path / "src/data").mkdir(parents=True)
  pq.write_table(table, tmp_path / "src/data/train-00000-of-00001.parquet")
  examples = load(tmp_path, "countdown", "train", on_bad_row="skip")
  assert [e["nums"] for e in examples] == [[4, 5]]
  (bad,) = examples.bad_rows
  assert (bad.unit, bad.line, bad.field) == ("row", 2, "nums")


def test_csqa_lettered_options(tmp_path):
  choices = [{"label": label, "text": text} for label, text in zip("ABCDE", "vwxyz", strict=True)]
  rows = [
    {"id": "q1", "answerKey": "C", "question": {"stem": "Pick x.", "choices": choices}},
    {"id": "q2", "answerKey": "F", "question": {"stem": "Bad key.", "choices": choices}},
  ]
  write(tmp_path / "src/dev_rand_split.jsonl", jsonl(rows))
  examples = load(tmp_path, "csqa", "validation", on_bad_row="skip")
  (example,) = examples
  assert example["answer"] == "C" and example["answer_text"] == "x"
  assert example["choices"] == list("vwxyz")
  assert example["prompt"] == "Pick x.\n\nA. v\nB. w\nC. x\nD. y\nE. z"
  assert examples.bad_rows[0].field == "answerKey" and examples.bad_rows[0].line == 2


def test_gpqa_shuffles_per_row_from_the_seed(tmp_path):
  rows = [
    [f"rec{i}", f"Question {i}\nsecond line", f"right{i}", "w1", "w2", "w3", "Physics"]
    for i in range(6)
  ]
  rows.insert(2, ["recbad", "Question?", "", "w1", "w2", "w3", "Physics"])
  path = tmp_path / "src/gpqa_diamond.csv"
  path.parent.mkdir()
  incorrect = [f"Incorrect Answer {i}" for i in (1, 2, 3)]
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["Record ID", "Question", "Correct Answer", *incorrect, "High-level domain"])
    writer.writerows(rows)
  with pytest.raises(data.BadRowError) as info:
    load(tmp_path, "gpqa", "diamond")
  # Records 1 and 2 span two lines each: the bad record starts on line 6.
  assert (info.value.path, info.value.line, info.value.field) == (str(path), 6, "Correct Answer")
  seed0 = load(tmp_path, "gpqa", "diamond", on_bad_row="skip", seed=0)
  again = load(tmp_path, "gpqa", "diamond", on_bad_row="skip", seed=0)
  seed1 = load(tmp_path, "gpqa", "diamond", on_bad_row="skip", seed=1)
  assert list(seed0) == list(again)
  assert [e["choices"] for e in seed0] != [e["choices"] for e in seed1]
  for example in [*seed0, *seed1]:
    letter = example["answer"]
    assert example["choices"][formats.LETTERS.index(letter)] == example["answer_text"]
    assert sorted(example["choices"]) == sorted([example["answer_text"], "w1", "w2", "w3"])
    assert f"\n{letter}. {example['answer_text']}" in example["prompt"]
  assert len({e["answer"] for e in seed0}) > 1  # The correct option does not always come first.


def test_hotpotqa_context_in_prompt(tmp_path):
  rows = [
    {
      "_id": "h1",
      "question": "Who?",
      "answer": "Ada",
      "type": "bridge",
      "level": "easy",
      "context": [["Ada Lovelace", ["Ada wrote notes.", " She was a mathematician."]]],
    }
  ]
  write(tmp_path / "src/hotpot_dev_distractor_v1.json", json.dumps(rows))
  (example,) = load(tmp_path, "hotpotqa", "validation")
  assert example["answer"] == "Ada" and example["id"] == "h1"
  assert example["context"] == rows[0]["context"]
  assert example["prompt"] == (
    "Ada Lovelace: Ada wrote notes. She was a mathematician.\n\nQuestion: Who?"
  )


def test_mbpp_splits_by_task_id(tmp_path):
  def row(task_id, tests):
    return {
      "task_id": task_id,
      "text": f"Write f{task_id}.",
      "code": "def f(): return 1",
      "test_list": tests,
      "test_setup_code": "",
      "challenge_test_list": [],
    }

  rows = [row(2, ["assert f() == 1"]), row(11, ["assert f() == 1", "assert f()"]), row(12, [])]
  write(tmp_path / "src/mbpp.jsonl", jsonl(rows))
  examples = load(tmp_path, "mbpp", "test", on_bad_row="skip")
  (example,) = examples
  assert example["task_id"] == 11 and example["test_list"] == ["assert f() == 1", "assert f()"]
  assert example["answer"] == "def f(): return 1"
  assert example["prompt"].endswith(
    "Your code should pass these tests:\n\nassert f() == 1\nassert f()"
  )
  assert examples.bad_rows[0].field == "test_list" and examples.bad_rows[0].line == 3
  assert [e["task_id"] for e in load(tmp_path, "mbpp", "prompt")] == [2]
  with pytest.raises(ValueError, match="mbpp/train has no rows"):
    load(tmp_path, "mbpp", "train")


# --- Row parsers and readers without TFDS --------------------------------------------------------


@pytest.mark.parametrize(
  ("task", "row", "field"),
  [
    ("gsm8k", {"question": "q", "answer": "#### "}, "answer"),
    ("deepscaler", {"problem": " ", "answer": "1"}, "problem"),
    ("math500", {"problem": "p", "answer": "1", "level": "hard"}, "level"),
    ("countdown", {"nums": "1 2", "target": 3}, "nums"),
    ("countdown", {"nums": [1, 2], "target": 3.5}, "target"),
    (
      "csqa",
      {"question": "q", "choices": {"label": ["A", "C"], "text": ["a", "c"]}, "answerKey": "A"},
      "choices",
    ),
    ("hotpotqa", {"question": "q", "answer": "a", "context": [["t", "not a list"]]}, "context"),
    ("mbpp", {"task_id": "x", "text": "t", "code": "c", "test_list": ["assert 1"]}, "task_id"),
  ],
)
def test_parsers_name_the_bad_field(task, row, field):
  with pytest.raises(readers.FieldError) as info:
    formats.PARSERS[task](row, fallback_id="test-0")
  assert info.value.field == field


def test_malformed_json_list_cannot_be_skipped(tmp_path):
  path = write(tmp_path / "bad.json", '[\n  {"a": 1},\n  {"a": \n]')
  with pytest.raises(readers.BadRowError, match="bad.json, line 4: field '<row>': invalid JSON"):
    list(readers.read_json(path))


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
    data.load_task("reasoning_gym/chain_sum", "train", limit=2, source_dir="/nonexistent")
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


# --- rows that cannot be read: bytes, surrogates, nesting, huge integers --------------------------

_GOOD = json.dumps(GSM8K_ROWS[0]).encode()
_BAD_LINES = {
  "non_utf8": (b'{"question": "caf\xe9?", "answer": "#### 1"}', "<row>", "not UTF-8: byte 0xe9"),
  "surrogate": (b'{"question": "x\\ud800y", "answer": "#### 1"}', "question", "lone surrogate"),
  "nested": (b'{"question": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "<row>", "nested too"),
  "huge_int": (b'{"question": "q", "answer": ' + b"7" * 5000 + b"}", "answer", "5000 digits"),
}


@pytest.mark.parametrize("case", sorted(_BAD_LINES))
def test_unreadable_jsonl_rows_name_file_and_line(tmp_path, case):
  bad, field, reason = _BAD_LINES[case]
  path = tmp_path / "src" / "test.jsonl"
  path.parent.mkdir(parents=True)
  path.write_bytes(b"\n".join([_GOOD, bad, _GOOD]) + b"\n")
  with pytest.raises(data.BadRowError, match=f"line 2: field '{re.escape(field)}'.*{reason}") as e:
    load(tmp_path, "gsm8k", "test")
  assert e.value.path == str(path)
  examples = load(tmp_path, "gsm8k", "test", on_bad_row="skip")
  assert len(examples) == 2 and examples.num_skipped == 1


def test_unreadable_rows_in_json_lists_and_csv(tmp_path):
  # A JSON list: bytes that are not UTF-8 and huge integers are per-row (skippable) errors.
  rows = [
    b'{"problem": "p1", "answer": "1", "solution": "s"}',
    b'{"problem": "\xff\xfe", "answer": "2", "solution": "s"}',
    b'{"problem": "p3", "answer": ' + b"9" * 5000 + b', "solution": "s"}',
    b'{"problem": "p4", "answer": "4", "solution": "s"}',
  ]
  (tmp_path / "ds").mkdir()
  (tmp_path / "ds" / "deepscaler.json").write_bytes(b"[\n" + b",\n".join(rows) + b"\n]\n")
  kwargs = {"data_dir": str(tmp_path / "tfds"), "source_dir": str(tmp_path / "ds")}
  with pytest.raises(data.BadRowError, match="deepscaler.json, line 3: field 'problem': not valid"):
    data.load_task("deepscaler", "train", **kwargs)
  examples = data.load_task("deepscaler", "train", on_bad_row="skip", **kwargs)
  assert [e["answer"] for e in examples] == ["1", "4"]
  assert [(b.line, b.field) for b in examples.bad_rows] == [(3, "problem"), (4, "answer")]
  # Too deeply nested: the rest of the list cannot be found, so this one cannot be skipped.
  deep = b'{"problem": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
  (tmp_path / "ds" / "deepscaler.json").write_bytes(b"[\n" + rows[0] + b",\n" + deep + b"\n]")
  with pytest.raises(data.BadRowError, match="deepscaler.json, line 3: .*nested too deeply"):
    data.load_task("deepscaler", "train", on_bad_row="skip", **kwargs)
  # CSV: a byte that is not UTF-8 and an integer beyond int64 name their record's line.
  header = "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3"
  lines = [header.encode(), b"Q1,a,b,c,d", b"Q\xe92,a,b,c,d", b"Q3,a,b,c,d"]
  (tmp_path / "gpqa").mkdir()
  (tmp_path / "gpqa" / "gpqa_diamond.csv").write_bytes(b"\n".join(lines) + b"\n")
  kwargs = {"data_dir": str(tmp_path / "tfds"), "source_dir": str(tmp_path / "gpqa")}
  with pytest.raises(data.BadRowError, match="gpqa_diamond.csv, line 3: field 'Question'"):
    data.load_task("gpqa", "diamond", **kwargs)
  assert len(data.load_task("gpqa", "diamond", on_bad_row="skip", **kwargs)) == 2


def test_countdown_integer_beyond_int64_is_a_bad_field(tmp_path):
  rows = [{"nums": [1, 2], "target": 3}, {"nums": [1, 2], "target": 10**30}]
  write(tmp_path / "src/test.jsonl", jsonl(rows))
  with pytest.raises(data.BadRowError, match="line 2: field 'target'"):
    load(tmp_path, "countdown", "test")


def test_on_bad_row_from_the_config_section(tmp_path):
  from experiments import run_data

  write(tmp_path / "src/test.jsonl", jsonl([GSM8K_ROWS[0], {"question": "q"}, GSM8K_ROWS[1]]))
  section = {
    "task": "gsm8k",
    "split": "test",
    "data_dir": str(tmp_path / "tfds"),
    "source_dir": str(tmp_path / "src"),
    "on_bad_row": "raise",
  }
  from experiments import config_check

  with pytest.raises(config_check.ConfigError, match=r"config\.data: .*line 2") as raised:
    run_data.load_examples(section, "data")
  assert isinstance(raised.value.__cause__, data.BadRowError)
  examples = run_data.load_examples({**section, "on_bad_row": "skip"}, "data")
  assert len(examples) == 2 and examples.num_skipped == 1
