"""Tests for es_jax.data.files (your own question/answer file as a task), the user rewards of
es_jax.rewards ("module:function", "file.py:function") and the config rules of task "file"."""

import csv
import json

import pytest
from run_configs import with_fields
from tiny_models import tiny_tokenizer

from es_jax import data, rewards
from es_jax.data import BadRowError, format_prompt, load_file_task
from experiments.configs import custom, demo
from experiments.evaluation import evaluate
from experiments.runners import run_data
from experiments.schema import check as config_check


def _jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def test_jsonl_rows_become_examples_with_the_rewards_answer_format(tmp_path):
  path = _jsonl(
    tmp_path / "mine.jsonl",
    [
      {"q": "What is 2 + 2?", "a": 4, "topic": "sums"},
      {"q": "Capital of France?", "a": ["Paris", "paris city"], "id": "fr"},
    ],
  )
  examples = load_file_task(path, question_field="q", answer_field="a", reward="qa")
  assert len(examples) == 2 and examples.task == data.FILE_TASK
  first, second = examples[0], examples[1]
  assert first["prompt"] == "What is 2 + 2?" and first["answer"] == "4"  # numbers as text
  assert first["id"] == "mine.jsonl:1" and second["id"] == "fr" and first["topic"] == "sums"
  assert second["answer"] == ["Paris", "paris city"]  # qa aliases
  assert examples.source["sha256"] and examples.source["rows"] == 2
  # The chat prompt asks for the format the reward reads (qa: <answer> tags).
  text = format_prompt(first, tiny_tokenizer())
  assert "<answer>" in text and "What is 2 + 2?" in text and "<|im_start|>assistant" in text
  boxed = load_file_task(path, question_field="q", answer_field="a", reward="math")[0]
  assert "\\boxed{}" in format_prompt(boxed, tiny_tokenizer())
  assert rewards.get_reward("qa")("<answer>paris</answer>", second) == 1.0


def test_a_prompt_template_is_fed_as_is(tmp_path):
  path = _jsonl(tmp_path / "t.jsonl", [{"question": "2+3", "answer": "5", "hint": "add"}])
  ex = load_file_task(path, prompt_template="Q: {question} ({hint})\nA:")[0]
  assert format_prompt(ex, tiny_tokenizer()) == "Q: 2+3 (add)\nA:"
  with pytest.raises(BadRowError, match=r"t\.jsonl, line 1: field 'level': used by the prompt"):
    load_file_task(path, prompt_template="{question} {level}")
  with pytest.raises(ValueError, match="named fields"):
    load_file_task(path, prompt_template="{} and {question}")


def test_csv_and_bad_rows_name_file_line_and_field(tmp_path):
  csv_path = tmp_path / "mine.csv"
  with open(csv_path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerows([["question", "answer"], ["1+1", "2"], ["2+2", ""], ["3+3", "6"]])
  with pytest.raises(BadRowError, match=r"mine\.csv, line 3: field 'answer': empty"):
    load_file_task(str(csv_path))
  kept = load_file_task(str(csv_path), on_bad_row="skip")
  assert [e["answer"] for e in kept] == ["2", "6"] and kept.num_skipped == 1
  bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "a", "answer": "b"}, "{oops", {"answer": 1}])
  with pytest.raises(BadRowError, match=r"bad\.jsonl, line 2: field '<row>': invalid JSON"):
    load_file_task(bad)
  no_question = _jsonl(tmp_path / "nq.jsonl", [{"question": "a", "answer": "b"}, {"answer": 1}])
  with pytest.raises(BadRowError, match=r"nq\.jsonl, line 2: field 'question': missing"):
    load_file_task(no_question)
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    load_file_task(str(tmp_path / "nope.jsonl"))
  assert (
    len(load_file_task(_jsonl(tmp_path / "l.jsonl", [{"question": 1, "answer": 2}] * 5), limit=3))
    == 3
  )


def test_user_rewards_by_module_or_file(tmp_path, monkeypatch):
  (tmp_path / "my_reward.py").write_text(
    "def score(completion, example):\n  return float(example['answer'] in completion)\n"
    "def wrong(completion):\n  return 1.0\n"
  )
  monkeypatch.chdir(tmp_path)
  ex = {"answer": "42"}
  for name in ("my_reward.py:score", f"{tmp_path}/my_reward.py:score"):
    assert rewards.get_reward(name)("so 42", ex) == 1.0
    assert rewards.is_correct("so 42", ex, task=name) and not rewards.is_correct("7", ex, task=name)
    assert rewards.answer_key("so 42", task=name) is None  # abstains from Maj@k
  monkeypatch.syspath_prepend(str(tmp_path))
  assert rewards.get_reward("my_reward:score")("42", ex) == 1.0
  for name, match in (
    ("my_reward.py:nope", "has no function 'nope'"),
    ("my_reward.py:wrong", r"must take \(completion: str, example: dict\)"),
    ("missing.py:score", "no such file"),
    ("no_such_module_xyz:score", "importing no_such_module_xyz failed"),
  ):
    with pytest.raises(ValueError, match=match):
      rewards.get_reward(name)


_with = with_fields  # es__sigma sets es.sigma


def test_file_task_config_rules_and_required_keys():
  smoke = custom.get_config("smoke")
  assert config_check.validate(smoke) is smoke
  full = custom.get_config()
  for fields, message in (
    ({}, "config.model.path='' is invalid: model.source='hf' needs a path"),
    (dict(model__path="/m", data__path=""), "config.data.path='' is invalid"),
    (dict(model__path="/m", data__path="d.jsonl", data__reward=""), "config.data.reward=''"),
    (dict(model__path="/m", data__path="d.jsonl", data__reward="x.py:"), "config.data.reward"),
  ):
    with pytest.raises(config_check.ConfigError, match=message):
      config_check.validate(_with(full, **fields))
  ok = _with(full, model__path="/m", data__path="d.jsonl", data__reward="my_reward.py:score")
  assert config_check.validate(ok).data.reward == "my_reward.py:score"
  # A GRPO-only setting does not block an ES run (6 prompts x G = 8 rows, mini-batch 256).
  es = _with(ok, data__prompts_per_step=6)
  config_check.validate(es)
  with pytest.raises(config_check.ConfigError, match="config.grpo.mini_batch_size=256"):
    config_check.validate(_with(es, method="grpo"))
  # The file fields are refused where no task reads them (never silently ignored).
  for fields, name in (
    (dict(data__path="x.jsonl"), "config.data.path='x.jsonl'"),
    (dict(eval__path="x.jsonl"), "config.eval.path='x.jsonl'"),
    (dict(data__question_field="problem"), "config.data.question_field='problem'"),
  ):
    with pytest.raises(config_check.ConfigError, match=name):
      config_check.validate(_with(demo.get_config("smoke"), **fields))


def test_eval_of_a_file_task_reads_eval_path_and_scores_with_data_reward(tmp_path):
  train = _jsonl(tmp_path / "train.jsonl", [{"question": "1+1", "answer": "2"}] * 3)
  held = _jsonl(tmp_path / "held.jsonl", [{"question": "2+2", "answer": "4"}])
  config = _with(custom.get_config("smoke"), data__path=train, eval__path=held)
  section, task, label = evaluate.eval_section(config)
  assert (section["path"], task, label) == (held, "char_parity", "file_held")
  examples = run_data.load_examples(section, "eval", options=run_data.file_options(config.data))
  assert [e["prompt"] for e in examples] == ["2+2"]
  section, _, label = evaluate.eval_section(_with(config, eval__path=""))
  assert section["path"] == train and label == "file_train"  # the training file, with a warning
  with pytest.raises(config_check.ConfigError, match=r"config\.data\.path: .*nope\.jsonl"):
    run_data.load_examples({"task": "file", "path": str(tmp_path / "nope.jsonl")}, "data")


def _save_to_disk_layout(directory, rows, chunks=2):
  """A split directory as `datasets.Dataset.save_to_disk` writes it: Arrow IPC streams listed
  in state.json (the `datasets` package is not installed here; pyarrow writes the same files)."""
  import pyarrow as pa

  directory.mkdir()
  names = []
  for c in range(chunks):
    part = rows[c::chunks]
    name = f"data-{c:05d}-of-{chunks:05d}.arrow"
    table = pa.Table.from_pylist(part)
    with pa.OSFile(str(directory / name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    names.append(name)
  (directory / "dataset_info.json").write_text("{}")
  state = {"_data_files": [{"filename": n} for n in names], "_split": "train"}
  (directory / "state.json").write_text(json.dumps(state))
  return str(directory)


def test_a_saved_datasets_split_directory_is_a_file_task(tmp_path):
  rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
  path = _save_to_disk_layout(tmp_path / "train", rows)
  examples = load_file_task(path, reward="gsm8k")
  # Rows in file order (the chunks in state.json's order), numbered across the chunks.
  assert [examples[i]["answer"] for i in range(5)] == ["1", "3", "5", "2", "4"]
  assert examples[0]["id"] == "train:1" and examples[4]["id"] == "train:5"
  assert len(examples.source["sha256"]) == 64
  # A DatasetDict directory names its splits; a plain directory is refused.
  (tmp_path / "dict").mkdir()
  (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train"]}')
  _save_to_disk_layout(tmp_path / "dict" / "train", rows)
  with pytest.raises(ValueError, match=r"several splits \['train'\]: point the path at one"):
    load_file_task(str(tmp_path / "dict"), reward="gsm8k")
  (tmp_path / "plain").mkdir()
  with pytest.raises(ValueError, match="without state.json"):
    load_file_task(str(tmp_path / "plain"), reward="gsm8k")
  bad = [{"question": "q", "answer": None}]
  with pytest.raises(BadRowError, match=r"row 1.*answer"):
    load_file_task(_save_to_disk_layout(tmp_path / "bad", bad, chunks=1), reward="gsm8k")


def _text_file(path, text):
  path.write_text(text)
  return str(path)


def test_malformed_csv_records_name_file_and_line(tmp_path):
  header = "question,answer\n1+1,2\n"
  for name, text, line in (
    ("open.csv", header + '2+2,"4\n3+3,6\n4+4,8\n', 3),  # a quote left open to the end
    ("merge.csv", header + '2+2,"4\n3+3,6\n"4+4",8\n', 3),  # closed by a later row's quote
  ):
    path = _text_file(tmp_path / name, text)
    for on_bad_row in ("raise", "skip"):  # the rows after it cannot be found: never skipped
      with pytest.raises(BadRowError, match=rf"{name}, line {line}: field '<row>': invalid CSV"):
        load_file_task(path, on_bad_row=on_bad_row)
  width = _text_file(tmp_path / "width.csv", header + "2+2,4,extra\n3+3\n4+4,8\n")
  with pytest.raises(BadRowError, match=r"width\.csv, line 3: .*3 fields where the header has 2"):
    load_file_task(width)
  kept = load_file_task(width, on_bad_row="skip")
  assert [e["answer"] for e in kept] == ["2", "8"] and kept.num_skipped == 2
  assert "line 4" in str(kept.bad_rows[1]) and "1 fields where the header has 2" in str(
    kept.bad_rows[1]
  )
  quoted = _text_file(tmp_path / "ok.csv", header + '"a question\non two lines",5\n')
  assert [e["prompt"] for e in load_file_task(quoted)] == ["1+1", "a question\non two lines"]
  assert load_file_task(quoted)[0]["id"] == "ok.csv:2"  # the first data row is line 2


def test_nan_and_missing_answers_are_bad_rows(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  jsonl = _text_file(
    tmp_path / "nan.jsonl",
    '{"question": "1+1", "answer": 2}\n{"question": "2+2", "answer": NaN}\n'
    '{"question": "3+3", "answer": 6}\n',
  )
  with pytest.raises(BadRowError, match=r"nan\.jsonl, line 2: field 'answer': nan"):
    load_file_task(jsonl)
  kept = load_file_task(jsonl, on_bad_row="skip")
  assert [e["answer"] for e in kept] == ["2", "6"] and kept.num_skipped == 1
  parquet = tmp_path / "a.parquet"
  pq.write_table(
    pa.table({"question": ["1+1", "2+2", "3+3"], "answer": [2.0, float("nan"), None]}), parquet
  )
  with pytest.raises(BadRowError, match=r"a\.parquet, row 2: field 'answer': nan"):
    load_file_task(str(parquet))
  kept = load_file_task(str(parquet), on_bad_row="skip")
  assert [e["answer"] for e in kept] == ["2"] and kept.num_skipped == 2
  assert "row 3: field 'answer': missing" in str(kept.bad_rows[1])


def test_an_unreadable_parquet_or_arrow_file_is_named(tmp_path):
  broken = tmp_path / "broken.parquet"
  broken.write_bytes(b"PAR1 this is not a parquet file")
  for on_bad_row in ("raise", "skip"):
    with pytest.raises(BadRowError, match=r"broken\.parquet, row 1: .*not a readable Parquet"):
      load_file_task(str(broken), on_bad_row=on_bad_row)
  rows = [{"question": "q", "answer": "a"}]
  split = _save_to_disk_layout(tmp_path / "split", rows, chunks=1)
  (tmp_path / "split" / "data-00000-of-00001.arrow").write_bytes(b"garbage")
  with pytest.raises(BadRowError, match=r"data-00000-of-00001\.arrow, row 1: .*readable Arrow"):
    load_file_task(split)


def test_wrong_field_names_name_the_fields_present_and_the_option(tmp_path):
  path = _jsonl(tmp_path / "qa.jsonl", [{"problem": "1+1", "solution": "2"}] * 2)
  for on_bad_row in ("raise", "skip"):
    with pytest.raises(data.ColumnError, match=r"no field 'question'.*\['problem', 'solution'\]"):
      load_file_task(path, on_bad_row=on_bad_row)
  config = _with(custom.get_config("smoke"), data__path=path)
  options = run_data.file_options(config.data)
  with pytest.raises(
    config_check.ConfigError,
    match=r"config\.data\.question_field='question': .*\['problem', 'solution'\]: pick one with "
    r"--config\.data\.question_field",
  ):
    run_data.load_examples(config.data.to_dict(), "data", options=options)
  options = run_data.file_options(_with(config, data__question_field="problem").data)
  with pytest.raises(config_check.ConfigError, match=r"config\.data\.answer_field='answer'"):
    run_data.load_examples(config.data.to_dict(), "data", options=options)
  options = run_data.file_options(
    _with(config, data__question_field="problem", data__answer_field="solution").data
  )
  assert run_data.load_examples(config.data.to_dict(), "data", options=options)[0]["answer"] == "2"


@pytest.mark.parametrize(
  "fields, said",
  [
    (dict(data__question_field="problem"), r"config\.data\.question_field='problem'"),
    (dict(data__reward="missing_reward.py:score"), r"config\.data\.reward: .*no such file"),
    (dict(eval__path="missing.jsonl"), r"config\.eval\.path: .*missing\.jsonl"),
  ],
)
def test_files_and_reward_are_checked_before_the_model_loads(tmp_path, monkeypatch, fields, said):
  from experiments.runners import model_io, run_context

  def no_model(*args, **kwargs):
    raise AssertionError("the model was loaded before the cheap checks")

  monkeypatch.setattr(model_io, "load_model", no_model)
  monkeypatch.chdir(tmp_path)
  train = _jsonl(tmp_path / "train.jsonl", [{"question": "1+1", "answer": "2"}] * 3)
  config = _with(custom.get_config("smoke"), data__path=train, progress=False, **fields)
  with pytest.raises(config_check.ConfigError, match=said):
    run_context.make_context(config, str(tmp_path / "run"))
  with pytest.raises(AssertionError, match="model was loaded"):  # the checks pass: then it loads
    run_context.make_context(
      _with(custom.get_config("smoke"), data__path=train, progress=False), str(tmp_path / "run")
    )
