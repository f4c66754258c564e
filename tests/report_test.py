"""The cross-run report on small run directories written with the runners' own writers: table
values against hand-computed ones, standard errors, resumed timing, sequential stages, several
evaluation tasks, n/a reasons, the PNGs, and bad input."""

import json
import math
import os

import numpy as np
import pytest
from ml_collections import ConfigDict

from experiments.configs.base import base_config
from experiments.evaluation import results as eval_results
from experiments.infra.logger import RunLogger
from experiments.reports import curves as report_curves
from experiments.reports import plots, report
from experiments.reports import runs as report_runs

TASK = "gsm8k"


def _write_eval(eval_dir, label, problems, *, ks=(1, 2, 4), segments=(90.0, 30.0)):
  """eval/ as experiments.evaluation.evaluate writes it: records, settings, table.json, timing.

  problems: (correct list, answers list, greedy_correct, summed entropy, lengths) per problem.
  """
  os.makedirs(eval_dir, exist_ok=True)
  jsonl = os.path.join(eval_dir, label + ".jsonl")
  settings = {"label": label, "task": label, "num_samples": 4, "temperature": 0.6}
  eval_results.open_records(
    jsonl, os.path.join(eval_dir, label + ".meta.json"), settings, resume=False
  )
  records = []
  for i, (correct, answers, greedy, entropy, lengths) in enumerate(problems):
    scored = {
      "correct": correct,
      "answers": answers,
      "lengths": lengths,
      "entropy": entropy,
      "greedy": (greedy, answers[0], lengths[0]),
    }
    records.append(eval_results.make_record(i, {"id": f"p{i}"}, scored))
    eval_results.append_record(jsonl, records[-1])
  for s in segments:  # an evaluation resumed once: two segments
    eval_results.append_timing(eval_dir, label, seconds=s, problems=1)
  return {label: eval_results.summarize(records, ks=ks)}


PROBLEMS = [  # c = 2, 0, 4 of n = 4
  ([1, 0, 1, 0], ["7", "3", "7", "3"], True, 8.0, [4, 4, 4, 4]),
  ([0, 0, 0, 0], ["1", None, "2", "1"], False, 24.0, [2, 2, 4, 4]),
  ([1, 1, 1, 1], ["5", "5", "5", "5"], True, 4.0, [1, 1, 1, 1]),
]


def _logger_run(workdir, config, steps, *, stage_of=lambda s: None, reward_key="fitness/mean"):
  """metrics.jsonl as a run killed after step 3 and resumed from its step-2 checkpoint writes it.

  steps: {step: step_seconds} of the run's final history.
  """
  with RunLogger(workdir, config=config, tensorboard=False, resume_step=-1) as log:
    log.log(0, {"eval/pass@1": 0.1})
    for s in (1, 2, 3):
      log.log(
        s,
        {
          reward_key: 0.1 * s,
          "entropy/mean": 1.0,
          "drift": 0.01 * s,
          "step_seconds": 1000.0 if s == 3 else steps[s],
          "compile_seconds": 100.0 if s == 3 else steps[s] / 10,
        },
        stage=stage_of(s),
      )
  with RunLogger(workdir, config=config, tensorboard=False, resume_step=2) as log:  # resume
    for s in sorted(steps):
      if s > 2:
        log.log(
          s,
          {
            reward_key: 0.1 * s,
            "entropy/mean": 0.9,
            "drift": 0.01 * s,
            "step_seconds": steps[s],
            "compile_seconds": steps[s] / 10,
          },
          stage=stage_of(s),
        )


def _es_config(method="es", **extra):
  return {
    "method": method,
    "seed": 0,
    "model": {"source": "random", "preset": "tiny-llama"},
    "es": {
      "population_size": 4,
      "sigma": 1e-3,
      "learning_rate": 5e-4,
      "rank": 0,
      "temperature": 0.0,
    },
    "grpo": {"num_generations": 2, "learning_rate": 1e-5, "beta": 0.0},
    **extra,
  }


@pytest.fixture()
def runs(tmp_path):
  root = tmp_path / "runs"
  base = root / "base"
  summaries = _write_eval(str(base / "eval"), TASK, PROBLEMS)
  eval_results.write_report(summaries, str(base / "eval"))
  es_dir = root / "es"
  _logger_run(str(es_dir), _es_config(), {1: 30.0, 2: 60.0, 3: 60.0, 4: 90.0})
  problems = [PROBLEMS[0], PROBLEMS[2], PROBLEMS[2]]  # c = 2, 4, 4
  summaries = _write_eval(str(es_dir / "eval"), TASK, problems, segments=(60.0,))
  eval_results.write_report(summaries, str(es_dir / "eval"))
  os.makedirs(es_dir / "diversity")
  # the writer experiments.studies.diversity uses, with the fields it writes
  eval_results.write_json(
    str(es_dir / "diversity" / "table.json"),
    {
      "rows": [
        {"kind": "group", "js_succ": 0.0, "js_succ_ci": [0.0, 0.0]},
        {"kind": "es", "js_succ": 0.0123, "js_succ_ci": [0.01, 0.015]},
      ]
    },
  )
  seq = root / "grpo_es"
  _logger_run(
    str(seq),
    _es_config("sequential", sequential={"order": "grpo_es"}),
    {1: 10.0, 2: 10.0, 3: 20.0, 4: 20.0},
    stage_of=lambda s: "1_grpo" if s <= 2 else "2_es",
    reward_key="reward/mean",
  )
  for stage in ("stage1_grpo", "stage2_es"):
    os.makedirs(seq / stage / "checkpoints")
  summaries = _write_eval(str(seq / "eval"), TASK, PROBLEMS[:2])
  eval_results.write_report(summaries, str(seq / "eval"))
  return root


def _row(text, name):
  lines = [ln for ln in text.splitlines() if ln.startswith(f"| {name} |")]
  assert len(lines) == 1, (name, lines)
  return [c.strip() for c in lines[0].strip("|").split("|")]


def _header(text):
  line = next(ln for ln in text.splitlines() if ln.startswith("| method |"))
  return [c.strip() for c in line.strip("|").split("|")]


def test_report_values_equal_hand_computed_ones(runs, tmp_path):
  out = tmp_path / "out"
  result = report.build([str(runs)], str(out))  # a directory of runs stands for them
  text = open(result["report"]).read()
  head = _header(text)
  assert head[:9] == [
    "method",
    "steps",
    "greedy",
    "Pass@1",
    "Pass@2",
    "Pass@4",
    "Maj@1",
    "Maj@2",
    "Maj@4",
  ]
  base = dict(zip(head, _row(text, "base"), strict=True))
  # Pass@1 = mean(2/4, 0, 1) = 0.5, SE = std([.5, 0, 1], ddof=1)/√3 = 0.5/√3.
  assert base["Pass@1"] == f"0.500 ± {0.5 / math.sqrt(3):.3f}"
  # Pass@2: 1 − C(2,2)/C(4,2) = 5/6 for c = 2; mean (5/6 + 0 + 1)/3.
  p2 = np.array([5 / 6, 0.0, 1.0])
  assert base["Pass@2"] == f"{p2.mean():.3f} ± {p2.std(ddof=1) / math.sqrt(3):.3f}"
  assert base["Pass@4"].startswith(f"{2 / 3:.3f} ± ")
  # greedy 1, 0, 1 (binomial SE of 2/3 on 3 problems); Maj@1: first answers 7 (right), 1, 5.
  g = np.array([1.0, 0.0, 1.0])
  assert base["greedy"] == f"{2 / 3:.3f} ± {g.std(ddof=1) / math.sqrt(3):.3f}"
  assert base["Maj@1"].startswith("0.667 ± ")
  # Maj@4 of problem 0: 7 and 3 tie two-two, 7 seen first and right: 1, 0, 1.
  assert base["Maj@4"].startswith("0.667 ± ")
  # Token-weighted entropy: Σ entropy / Σ tokens = (8 + 24 + 4) / (16 + 12 + 4).
  assert base["entropy (nats)"].startswith(f"{36 / 32:.3f} ± ")
  assert base["eval min"] == "2.0"  # 90 s + 30 s over two segments
  for col in ("steps", "drift", "JS_succ [95% CI]", "train min", "compile s"):
    assert base[col] == "n/a"
  assert "base: steps, train min: no metrics.jsonl." in result["notes"]

  es = dict(zip(head, _row(text, "ES"), strict=True))
  assert es["steps"] == "4"
  # The resumed run: step 3's first attempt (1000 s) was dropped, 30 + 60 + 60 + 90 = 240 s.
  assert es["train min"] == "4.0"
  assert es["compile s"] == "24.0"  # a tenth of each kept step's seconds: 3 + 6 + 6 + 9
  assert es["drift"] == "0.0400"
  assert es["JS_succ [95% CI]"] == "0.0123 [0.0100, 0.0150]"
  assert es["Pass@1"] == f"{(0.5 + 1 + 1) / 3:.3f} ± {np.std([0.5, 1, 1], ddof=1) / 3**0.5:.3f}"
  assert es["eval min"] == "1.0"

  seq = dict(zip(head, _row(text, "GRPO→ES"), strict=True))
  assert seq["steps"] == "2+2"
  assert seq["train min"] == f"{60 / 60:.1f}"
  assert seq["Pass@1"] == "0.250 ± 0.250"  # mean(0.5, 0); std(ddof=1) 0.354 / √2
  # The numbers returned agree with the table.
  assert result["runs"]["base"][TASK]["pass@1"] == pytest.approx(0.5)
  assert result["runs"]["base"][TASK]["pass@1_se"] == pytest.approx(0.5 / math.sqrt(3))
  for png in ("pareto", "pass_at_k", "reward", "entropy"):
    assert os.path.getsize(result["figures"][png]) > 1000
    assert f"![{png}]({png}.png)" in text
  # ES (0.833, 1.0) beats base (0.5, 0.667) and GRPO→ES (0.25, 0.5) on both.
  assert "Pareto front (Pass@1, Pass@4): ES." in text
  assert "n = 4 at T = 0.6" in text


def test_differences_from_the_first_run_are_paired_over_problems(runs, tmp_path):
  result = report.build([str(runs)], str(tmp_path / "out"))
  text = open(result["report"]).read()
  assert "Difference from base on the same problems" in text
  rows = [ln for ln in text.splitlines() if ln.startswith("| difference |")]
  assert len(rows) == 1
  head = [c.strip() for c in rows[0].strip("|").split("|")]
  assert head == ["difference", "Δ greedy", "Δ Pass@1", "Δ Pass@2", "Δ Pass@4"]
  es = dict(zip(head, _row(text, "ES − base"), strict=True))
  # ES minus base per problem: Pass@1 (0.5, 1, 1) − (0.5, 0, 1) = (0, 1, 0); greedy the same.
  d = np.array([0.0, 1.0, 0.0])
  expected = f"+{d.mean():.3f} ± {d.std(ddof=1) / math.sqrt(3):.3f}"
  assert es["Δ greedy"] == es["Δ Pass@1"] == expected
  # Pass@4: (1, 1, 1) − (1, 0, 1).
  assert es["Δ Pass@4"] == expected
  # GRPO→ES was evaluated on two problems only: no paired row, and a note says why.
  assert "| GRPO→ES − base |" not in text
  assert "GRPO→ES: gsm8k differences: other problems than base's." in result["notes"]


def test_pairs_tabulate_differences_between_named_runs(runs, tmp_path):
  c = base_config()
  c.method = "report"
  c.report.workdirs = str(runs)
  c.report.pairs = "base:ES, ES:GRPO→ES"
  c.lock()
  result = report.run(c, str(tmp_path / "w"))
  text = open(result["report"]).read()
  part = text[text.index("Differences between runs on the same problems") :]
  # base minus ES per problem: Pass@1 (0.5, 0, 1) − (0.5, 1, 1) = (0, −1, 0).
  d = np.array([0.0, -1.0, 0.0])
  row = _row(part, "base − ES")
  assert row[1] == row[2] == f"{d.mean():+.3f} ± {d.std(ddof=1) / math.sqrt(3):.3f}"
  assert "| ES − GRPO→ES |" not in part  # two problems against three: a note, no row
  assert "ES: gsm8k differences: other problems than GRPO→ES's." in result["notes"]
  for pairs, match in (
    ("ES", r"config.report.pairs='ES' is invalid: need comma-separated 'name:other name' pairs"),
    ("ES:nope", "config.report.pairs: .*'nope' is not a run"),
  ):
    bad = ConfigDict(c.to_dict())
    bad.report.pairs = pairs
    with pytest.raises(ValueError, match=match):
      report.run(bad, str(tmp_path / "w2"))


def test_stage_subdir_and_names_and_several_tasks(runs, tmp_path):
  # A second task in the ES run only: one table per task, the others n/a with why.
  summaries = _write_eval(str(runs / "es" / "eval"), TASK, [PROBLEMS[0], PROBLEMS[2], PROBLEMS[2]])
  summaries.update(_write_eval(str(runs / "es" / "eval"), "math500", PROBLEMS[1:]))
  eval_results.write_report(summaries, str(runs / "es" / "eval"))
  workdirs = f"{runs / 'base'},{runs / 'es'},{runs / 'grpo_es' / 'stage2_es'}"
  result = report.build(workdirs, str(tmp_path / "out"), names="B,E,S2")
  text = open(result["report"]).read()
  assert "## gsm8k" in text and "## math500" in text
  math_part = text[text.index("## math500") :]
  assert _row(math_part, "E")[3].startswith("0.500 ± ")  # c = 0, 4: Pass@1 0.5
  assert _row(math_part, "B")[3] == "n/a"
  assert "B: math500 metrics: task math500 not evaluated." in result["notes"]
  stage = _row(text[: text.index("## math500")], "S2")
  assert stage[1] == "2" and stage[3] == "n/a"  # the stage's 2 steps; its eval is the parent's
  assert stage[-3] == f"{40 / 60:.1f}"  # steps 3 and 4 of the parent: 20 s + 20 s
  assert stage[-2] == "4.0"  # their compile seconds, a tenth of that
  for name in ("pareto_gsm8k", "pass_at_k_gsm8k", "pareto_math500", "pass_at_k_math500"):
    assert os.path.getsize(result["figures"][name]) > 1000


def test_training_curves_prefer_train_reward_mark_stages_and_plot_equal_compute(runs, tmp_path):
  seq = report_runs.load_run(str(runs / "grpo_es"))
  assert report_curves.stage_boundaries(seq) == [2.5]  # steps 1-2 GRPO, 3-4 ES
  assert report_curves.stage_boundaries(report_runs.load_run(str(runs / "es"))) == []
  figures, notes = report_curves.training_curves([seq], str(tmp_path))
  assert set(figures) == {"reward", "entropy"}  # the fixture's runs log no train/samples
  assert notes == ["training reward at equal compute: n/a (no run logged it)."]
  # A run logging the shared names: train/reward wins over the legacy key, and train/samples
  # gives the equal-compute curve.
  with RunLogger(str(tmp_path / "new"), tensorboard=False, resume_step=-1) as log:
    for s in (1, 2, 3):
      row = {"train/reward": 0.5 * s, "fitness/mean": -1.0, "train/samples": 32 * s}
      log.log(s, row)
  new = report_runs.load_run(str(tmp_path / "new"), "new")
  assert report_curves.reward_series(new) == [[1, 2, 3], [0.5, 1.0, 1.5]]
  assert report_curves.reward_series(new, "train/samples") == [[32, 64, 96], [0.5, 1.0, 1.5]]
  figures, notes = report_curves.training_curves([new, seq], str(tmp_path / "both"))
  assert set(figures) == {"reward", "reward_samples", "entropy"} and not notes
  assert os.path.getsize(figures["reward_samples"]) > 1000


def test_entropy_curves_name_each_runs_rollout_temperature():
  """ES fitness (often greedy, T=0) and GRPO rollouts (T=1) differ: each curve says its T."""
  cfg = {"es": {"temperature": 0.0}, "grpo": {"temperature": 1.0}}
  es_run = report_runs.Run("ES", "es", config={"method": "es", **cfg})
  seq = report_runs.Run(
    "GRPO→ES", "s", config={"method": "sequential", "sequential": {"order": "grpo_es"}, **cfg}
  )
  stage = report_runs.Run("GRPO→ES 1_grpo", "s/stage1_grpo", config=seq.config, stage="1_grpo")
  assert report_curves.rollout_temperatures(es_run) == "T=0"
  assert report_curves.rollout_temperatures(seq) == "GRPO T=1 → ES T=0"
  assert report_curves.rollout_temperatures(stage) == "T=1"
  assert report_curves.rollout_temperatures(report_runs.Run("x", "x")) is None
  assert "not comparable" in report_curves.ENTROPY_NOTE
  # reward.png says so too when its curves come from different temperatures.
  grpo_run = report_runs.Run("GRPO", "g", config={"method": "grpo", **cfg})
  assert report_curves._reward_note([es_run, grpo_run]) == report_curves.REWARD_NOTE
  assert report_curves._reward_note([seq]) == report_curves.REWARD_NOTE  # T=1 then T=0
  assert report_curves._reward_note([es_run]) is None


def test_names_by_directory_and_a_diversity_study_in_its_own_workdir(runs, tmp_path):
  """dir=label names cannot follow the wrong order; a method=diversity workdir is not a row but
  the JS_succ of the run its diversity.run names."""
  study = tmp_path / "studies" / "es_div"
  os.makedirs(study / "diversity")
  os.rename(runs / "es" / "diversity" / "table.json", study / "diversity" / "table.json")
  config = {"method": "diversity", "diversity": {"run": str(runs / "es")}}
  eval_results.write_json(str(study / "config.json"), config)
  workdirs = f"{runs},{study}"
  result = report.build(workdirs, str(tmp_path / "out"), names="grpo_es=Seq,es=Evo")
  text = open(result["report"]).read()
  head = _header(text)
  evo = dict(zip(head, _row(text, "Evo"), strict=True))
  assert evo["steps"] == "4" and evo["JS_succ [95% CI]"] == "0.0123 [0.0100, 0.0150]"
  assert _row(text, "Seq")[1] == "2+2" and _row(text, "base")[1] == "n/a"  # unnamed: default
  assert "es_div" not in " ".join(result["runs"])
  # Without the study, the run has no JS_succ (the table moved out of it).
  alone = report.build(str(runs), str(tmp_path / "out2"))
  assert _row(open(alone["report"]).read(), "ES")[head.index("JS_succ [95% CI]")] == "n/a"
  bad = [
    ("es=A,B", "mixes labels and dir=label pairs"),
    ("nope=A", r"'nope=A': 0 runs match 'nope'; the runs are \['base', 'es', 'grpo_es'\]"),
    ("es=", "an empty label"),
  ]
  for names, match in bad:
    with pytest.raises(ValueError, match=match):
      report.build(workdirs, str(tmp_path / "o"), names=names)
  with pytest.raises(ValueError, match="es_div.* measured .*es', which is not among the runs"):
    report.build(f"{runs / 'base'},{study}", str(tmp_path / "o"))
  with pytest.raises(ValueError, match="holds only diversity studies"):
    report.build(str(study), str(tmp_path / "o"))


def test_run_method_config_and_bad_input(runs, tmp_path):
  c = base_config()
  c.method = "report"
  c.report.workdirs = str(runs / "es")
  c.lock()
  result = report.run(c, str(tmp_path / "w"))
  assert result["report"] == str(tmp_path / "w" / "report" / "report.md")
  assert os.path.getsize(tmp_path / "w" / "report" / "pareto.png") > 1000
  with pytest.raises(ValueError, match="config.report.workdirs is empty"):
    report.run(ConfigDict(dict(base_config().to_dict(), method="report")), str(tmp_path))
  with pytest.raises(ValueError, match="config.report.names: 1 names for 3 runs"):
    report.build(str(runs), str(tmp_path / "o"), names="x")
  with pytest.raises(ValueError, match="is not a directory"):
    report.build(str(tmp_path / "missing"), str(tmp_path / "o"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="holds no run"):
    report.build(str(tmp_path / "empty"), str(tmp_path / "o"))
  with open(runs / "base" / "eval" / f"{TASK}.jsonl", "a") as f:  # fewer records than the table
    f.truncate(0)
  with pytest.raises(ValueError, match="0 problem records"):
    report.build(str(runs / "base"), str(tmp_path / "o"))


def test_unfinished_evaluation_is_na_with_reason(tmp_path):
  _write_eval(str(tmp_path / "r" / "eval"), TASK, PROBLEMS)  # records, no table.json
  result = report.build(str(tmp_path / "r"), str(tmp_path / "out"))
  assert any("evaluation unfinished" in n for n in result["notes"])
  assert "No run has a finished evaluation" in open(result["report"]).read()


def test_pareto_front_and_plot(tmp_path):
  pts = {"a": (0.5, 0.9), "b": (0.6, 0.8), "c": (0.4, 0.7), "d": (0.6, 0.8)}
  assert plots.pareto_front(pts) == ["a", "b", "d"]
  path = plots.plot_pareto(
    {k: (*v, 0.05, math.nan) for k, v in pts.items()},
    tmp_path / "p.png",
    xlabel="Pass@1",
    ylabel="Pass@8",
  )
  assert os.path.getsize(path) > 1000
  with pytest.raises(ValueError, match="point 'x'"):
    plots.plot_pareto({"x": (math.nan, 0.1, 0.0, 0.0)}, tmp_path / "q.png", xlabel="a", ylabel="b")


def test_runs_with_different_ks(runs, tmp_path):
  summaries = _write_eval(str(runs / "base" / "eval"), TASK, PROBLEMS, ks=(1, 2))
  eval_results.write_report(summaries, str(runs / "base" / "eval"))
  result = report.build(f"{runs / 'base'},{runs / 'es'}", str(tmp_path / "out"))
  text = open(result["report"]).read()
  row = dict(zip(_header(text), _row(text, "base"), strict=True))
  assert row["Pass@4"] == "n/a" and row["Pass@2"] != "n/a"
  assert "base: gsm8k Pass@k, Maj@k for k = [4]: not in its eval.ks." in result["notes"]
  assert "Pareto front (Pass@1, Pass@2): ES." in text  # the largest k both evaluated


def test_maj_at_k_is_na_without_answers_to_vote_on(tmp_path):
  """A user's reward extracts no answer: Maj@k is n/a in table.md and the report, not 0.000."""
  assert not eval_results.has_votes("my_reward.py:score") and eval_results.has_votes(TASK)
  problems = [(c, [None] * 4, g, e, n) for c, _, g, e, n in PROBLEMS]
  eval_dir = str(tmp_path / "run" / "eval")
  summaries = _write_eval(eval_dir, "mine", problems)
  meta = os.path.join(eval_dir, "mine.meta.json")
  eval_results.write_json(meta, {**json.load(open(meta)), "task": "my_reward.py:score"})
  records = eval_results.read_records(os.path.join(eval_dir, "mine.jsonl"))
  user = eval_results.summarize(records, ks=(1, 2, 4), votes=False)
  assert user["maj@2"] is None and user["pass@1"] == summaries["mine"]["pass@1"] > 0
  assert summaries["mine"]["maj@2"] == 0.0  # what counting abstentions as wrong would show
  eval_results.write_report({"mine": user}, eval_dir)
  row = next(ln for ln in open(os.path.join(eval_dir, "table.md")) if ln.startswith("| mine"))
  assert row.count("n/a") == 3 and "0.500" in row  # Maj@1,2,4; Pass@1 = 6/12
  run = report_runs.load_run(str(tmp_path / "run"), "mine")
  assert run.tasks["mine"]["maj@2"] is None and "maj@2_se" not in run.tasks["mine"]
  lines = report.task_table([run], "mine", [])
  assert lines[-1].count("n/a") >= 3
