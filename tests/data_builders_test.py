"""Tests for es_jax.data: each builder on a small fixture file, the row parsers, and rows that
cannot be read (bytes, surrogates, nesting, huge integers)."""

import csv
import json
import re

import pytest
from data_files import GSM8K_ROWS, jsonl, load, write

from es_jax import data
from es_jax.data import formats, readers

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
  kwargs = {"files": data.DataFiles(str(tmp_path / "tfds"), str(source))}
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
  kwargs = {"files": data.DataFiles(str(tmp_path / "tfds"), str(tmp_path / "ds"))}
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
  kwargs = {"files": data.DataFiles(str(tmp_path / "tfds"), str(tmp_path / "gpqa"))}
  with pytest.raises(data.BadRowError, match="gpqa_diamond.csv, line 3: field 'Question'"):
    data.load_task("gpqa", "diamond", **kwargs)
  assert len(data.load_task("gpqa", "diamond", on_bad_row="skip", **kwargs)) == 2


def test_countdown_integer_beyond_int64_is_a_bad_field(tmp_path):
  rows = [{"nums": [1, 2], "target": 3}, {"nums": [1, 2], "target": 10**30}]
  write(tmp_path / "src/test.jsonl", jsonl(rows))
  with pytest.raises(data.BadRowError, match="line 2: field 'target'"):
    load(tmp_path, "countdown", "test")


def test_on_bad_row_from_the_config_section(tmp_path):
  from experiments.runners import run_data

  write(tmp_path / "src/test.jsonl", jsonl([GSM8K_ROWS[0], {"question": "q"}, GSM8K_ROWS[1]]))
  section = {
    "task": "gsm8k",
    "split": "test",
    "data_dir": str(tmp_path / "tfds"),
    "source_dir": str(tmp_path / "src"),
    "on_bad_row": "raise",
  }
  from experiments.schema import check as config_check

  with pytest.raises(config_check.ConfigError, match=r"config\.data: .*line 2") as raised:
    run_data.load_examples(section, "data")
  assert isinstance(raised.value.__cause__, data.BadRowError)
  examples = run_data.load_examples({**section, "on_bad_row": "skip"}, "data")
  assert len(examples) == 2 and examples.num_skipped == 1
