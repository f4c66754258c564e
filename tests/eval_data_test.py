"""Evaluation problems disjoint from training (es_jax.data.heldout, experiments.evaluation.data):
every shipped config and variant, the refusal of a too-small task space, the counts in the meta."""

import glob
import importlib
import json
import logging
import os

import pytest
from run_configs import smoke_config, with_fields

from es_jax import data
from experiments.configs import coverage_study, demo, fair_study, fair_study_v2
from experiments.evaluation import data as eval_data
from experiments.evaluation import evaluate
from experiments.reports import report
from experiments.runners import model_io
from experiments.schema import check as config_check

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs")
# Every shipped config file and variant (tests/configs_test.py checks they build).
EASY_MODELS = ["qwen2.5-1.5b", "llama-3.2-3b"]
VARIANTS = {
  "demo": [None, "smoke"],
  "custom": [None, "smoke"],
  "fair_study": [None, "smoke"],
  "fair_study_v2": [None, "smoke", *(f"candidate_{k}" for k in fair_study_v2.CANDIDATES)],
  "coverage_study": [None, "smoke", "zscore", "coverage", "zscore_smoke", "coverage_smoke"],
  "gsm8k_easy": [None, "smoke", "sweep", "forgetting", *EASY_MODELS],
  "deepscaler_hard": [None, "smoke", "forgetting"],
}
CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _config(name, variant):
  return importlib.import_module(f"experiments.configs.{name}").get_config(variant)


def _tasks(config):
  """Every task a config's run loads: (data task, [eval tasks])."""
  ev = [
    config.eval.task,
    *((t if isinstance(t, str) else t["task"]) for t in config.eval.extra_tasks),
  ]
  return config.data.task, ev


def _offline(config) -> bool:
  """Whether a config's data loads offline: generated tasks, shipped sample files."""
  sources = [config.data.get("source_dir"), config.eval.get("source_dir")]
  train, evals = _tasks(config)
  generated = all(data.gym.is_gym_task(t) for t in (train, *evals))
  files = train == data.FILE_TASK and bool(config.data.path)
  return generated or files or all(sources)


CASES = [(n, v) for n, vs in VARIANTS.items() for v in vs]


def test_the_case_list_covers_every_config_file():
  files = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIG_DIR, "*.py"))}
  assert files - {"__init__", "base", "choices"} == set(VARIANTS)


@pytest.mark.parametrize("name, variant", CASES)
def test_every_shipped_config_evaluates_on_problems_outside_its_training_pool(name, variant):
  config = _config(name, variant)
  if not _offline(config):  # needs a user download: its tasks are fixed files (tested below)
    train, evals = _tasks(config)
    assert not any(data.gym.is_gym_task(t) for t in (train, *evals)), (name, variant)
    return
  heldout = eval_data.training_set(config)
  assert heldout.exclude, "the training pool has prompts"
  tasks = eval_data.load_eval_tasks(config, heldout)
  for spec in (tasks.main, *tasks.extra):
    counts = data.overlap(spec.examples, heldout.exclude)
    n = len(spec.examples)
    assert n > 0 and counts == (n, n, 0), (name, variant, spec.label, counts)
    assert spec.num_seen_in_training == 0


@pytest.mark.parametrize(
  "module, limit", [(fair_study, 128), (coverage_study, 50), (demo, 32)], ids=lambda x: str(x)
)
def test_the_studies_evaluate_on_their_full_limit_of_new_problems(module, limit):
  config = module.get_config()
  assert config.eval.limit == limit
  tasks = eval_data.load_eval_tasks(config)
  assert len(tasks.main.examples) == limit
  train = data.load_task(
    config.data.task,
    config.data.split,
    limit=config.data.limit,
    task_config=config.data.task_config,
  )
  seen = data.prompt_keys(train)
  # The undisjoint draw of the same config does overlap: the exclusion did the work.
  plain = data.load_task(
    config.eval.task, config.eval.split, limit=limit, task_config=config.eval.task_config
  )
  assert data.overlap(plain, seen).num_seen_in_training > 0 or module is fair_study
  assert data.overlap(tasks.main.examples, seen) == (limit, limit, 0)


def test_normalised_prompts_fold_case_and_whitespace():
  assert data.normalize_prompt("  What IS\t7 +\n 7? ") == "what is 7 + 7?"
  assert data.normalize_prompt("7+7") != data.normalize_prompt("7 + 7")


def test_overlap_and_drop_seen_count_rows():
  rows = [{"prompt": p} for p in ("a b", "A  b", "c", "d", "c")]
  exclude = data.prompt_keys([{"prompt": "D"}])
  assert data.overlap(rows, exclude) == (5, 3, 1)
  kept = data.drop_seen(rows, exclude)
  assert [r["prompt"] for r in kept] == ["a b", "c"]
  assert kept.source["dropped_seen"] == 1 and kept.source["dropped_repeats"] == 2
  assert data.overlap(kept, exclude) == (2, 2, 0)


def test_draw_disjoint_skips_training_prompts_and_repeats():
  name = "reasoning_gym/chain_sum"
  train = data.load_task(name, "train", limit=150, task_config=CHAIN_SUM)
  seen = data.prompt_keys(train)
  plain = data.load_task(name, "test", limit=60, task_config=CHAIN_SUM)
  counts = data.overlap(plain, seen)
  assert counts.num_seen_in_training > 0 and counts.num_distinct < 60  # what is avoided
  drawn = data.draw_disjoint(name, "test", limit=40, task_config=CHAIN_SUM, exclude=seen)
  assert data.overlap(drawn, seen) == (40, 40, 0)
  assert drawn.source["draws"] > 40
  again = data.draw_disjoint(name, "test", limit=40, task_config=CHAIN_SUM, exclude=seen)
  assert [e["id"] for e in again] == [e["id"] for e in drawn]  # a fixed function of its args


def test_a_too_small_task_space_is_refused_with_its_size():
  with pytest.raises(data.TaskSpaceTooSmallError) as err:
    data.draw_disjoint(
      "reasoning_gym/chain_sum", "test", limit=250, task_config=CHAIN_SUM, exclude={"x"}
    )
  assert err.value.found == 200 and err.value.space == 201  # 10 x 10 x 2 sums, + 'x'
  assert "appears to hold about" in str(err.value)


def test_a_config_whose_task_is_too_small_is_refused_before_the_model_loads(monkeypatch):
  config = smoke_config(demo, eval__limit=300, eval__task_config=CHAIN_SUM)

  def load_model(*args, **kwargs):
    raise AssertionError("the model must not load before the refusal")

  monkeypatch.setattr(model_io, "load_model", load_model)
  with pytest.raises(config_check.ConfigError) as err:
    evaluate.run(config, "/nonexistent/never-written")
  message = str(err.value)
  assert "\n" not in message and message.startswith("config.eval.limit=300 is invalid")
  assert "appears to hold about" in message
  extra = {"task": "reasoning_gym/chain_sum", "label": "x", "limit": 300, "task_config": CHAIN_SUM}
  config = smoke_config(demo, eval__extra_tasks=(extra,))
  with pytest.raises(config_check.ConfigError, match=r"^config.eval.extra_tasks\[0\].limit=300"):
    eval_data.load_eval_tasks(config)


def _write(path, questions):
  with open(path, "w") as f:
    for q in questions:
      f.write(json.dumps({"question": q, "answer": "1"}) + "\n")
  return str(path)


def test_file_tasks_count_training_rows_warn_and_drop_them(tmp_path, caplog):
  train = _write(tmp_path / "train.jsonl", ["What is 1 + 1?", "What is 2 + 2?"])
  evals = _write(tmp_path / "test.jsonl", ["what is 1 +  1?", "What is 3 + 3?", "What is 3 + 3?"])
  fields = dict(data__task="file", data__path=train, data__reward="qa", eval__task="file")
  config = smoke_config(demo, eval__path=evals, **fields)
  with caplog.at_level(logging.WARNING, logger="experiments.evaluation.data"):
    tasks = eval_data.load_eval_tasks(config)
  assert tasks.main.num_seen_in_training == 1 and len(tasks.main.examples) == 3
  assert "1 of its 3 problems are training prompts" in caplog.text and "drop_seen" in caplog.text
  dropped = eval_data.load_eval_tasks(with_fields(config, eval__drop_seen=True))
  assert [e["prompt"] for e in dropped.main.examples] == ["What is 3 + 3?"]
  assert dropped.main.num_seen_in_training == 0
  counts = eval_data.problem_counts(dropped.main)
  assert (counts["num_problems"], counts["num_distinct"], counts["num_seen_in_training"]) == (
    1,
    1,
    0,
  )


@pytest.mark.slow  # a whole evaluation run
def test_the_meta_and_table_record_the_counts_and_other_problems_are_refused(tmp_path):
  config = smoke_config(demo)
  assert not evaluate.run(config, str(tmp_path))["stopped"]
  label = "reasoning_gym_chain_sum"
  meta = json.loads((tmp_path / "eval" / f"{label}.meta.json").read_text())
  n = config.eval.limit
  assert (meta["num_problems"], meta["num_distinct"], meta["num_seen_in_training"]) == (n, n, 0)
  table = (tmp_path / "eval" / "table.md").read_text()
  assert f"{label}: {n} problems, {n} distinct, 0 seen in training" in table
  built = report.build([str(tmp_path)], str(tmp_path / "report"))
  text = open(built["report"]).read()
  assert f"eval {label}: {n} problems, {n} distinct, 0 seen in training" in text
  # Other problems under the same label and settings: the resume is refused.
  other = smoke_config(demo, eval__split="validation")
  assert (
    eval_data.problem_counts(eval_data.load_eval_tasks(other).main)["problems"] != meta["problems"]
  )
  with pytest.raises(ValueError, match="problems"):
    evaluate.run(other, str(tmp_path))
