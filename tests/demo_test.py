"""experiments.studies.demo's overall ETA and report header (the demo run itself: runners_test)."""

from report_test import PROBLEMS, _write_eval
from run_configs import with_fields

from experiments.configs import custom
from experiments.evaluation import results as eval_results
from experiments.studies import demo


def test_clock_eta_is_steps_left_at_the_measured_pace_plus_an_evaluation_each(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(demo.time, "perf_counter", lambda: now[0])
  clock = demo.Clock({"base": 0, "es": 4, "grpo": 4, "grpo_es": 6, "es_grpo": 2})
  clock.eval_seconds = 10.0
  clock.done("base")
  assert "after the first training run" in clock.line()
  clock.done("grpo")  # finished before this process: no pace from it
  assert "after the first training run" in clock.line()
  now[0] += 60.0
  clock.done("es", 50.0)  # 40 s of training over 4 steps: 10 s per step
  # grpo_es: 6 · 10 + 10, es_grpo: 2 · 10 + 10
  assert clock.line() == "demo 1 min 00 s so far, overall ETA 1 min 40 s (runs left: 2)"
  clock.done("grpo_es", 10.0 + 6 * 20.0)  # (40 + 120) s over 10 steps: 16 s per step
  assert clock.line().endswith("overall ETA 42 s (runs left: 1)")


def test_report_header_counts_the_problems_evaluated_not_the_limit(tmp_path):
  """custom.py's eval.limit is 256; a 3-problem file is evaluated on 3 problems, and said so."""
  summaries = _write_eval(str(tmp_path / "base" / "eval"), "file_test", PROBLEMS)
  eval_results.write_report(summaries, str(tmp_path / "base" / "eval"))
  config = custom.get_config()
  assert config.eval.limit == 256
  config = with_fields(config, data__path="train.jsonl", eval__path="test.jsonl")
  text = open(demo.write_report(config, str(tmp_path), ["base"])).read()
  assert "evaluation on 3 problems of `test.jsonl`" in text and "256" not in text
