"""Benchmark scripts with built-in correctness checks run end to end at tiny sizes (device_checks.sh
runs them on an accelerator): equal fitness on the batched and seed-scheme sides, identical greedy
tokens to transformers. Timings are printed, never asserted."""

import re

import pytest

from experiments.benchmarks import (
  decode_cost,
  es_vs_sequential,
  sampler_vs_transformers,
  unit_speed,
)


@pytest.mark.slow  # the benchmark's agreement check; population_test compares members directly
def test_es_vs_sequential_sides_agree(capsys):
  # Raises AssertionError itself if the two sides' fitness differ.
  es_vs_sequential.main(
    [
      "--model",
      "tiny",
      "--population",
      "4",
      "--members_per_chunk",
      "2",
      "--repeats",
      "1",
      "--max_new_tokens",
      "4",
      "--no-looped",
    ]
  )
  out = capsys.readouterr().out
  assert "fitness equal on every side" in out
  assert re.search(r"ratio sequential / batched \(M=2\), best step time: [0-9.]+x", out)


@pytest.mark.slow  # the benchmark's own check; sampling_test compares the tokens in the quick tier
def test_sampler_vs_transformers_tokens_identical(capsys):
  sampler_vs_transformers.main(
    ["--models", "tiny", "--batch_sizes", "3", "--new_tokens", "6", "--repeats", "1"]
  )
  out = capsys.readouterr().out
  assert "identical=True" in out and "ratio" in out


@pytest.mark.slow
def test_decode_cost_runs_and_prints_both_loops(capsys):
  decode_cost.main(
    ["--model", "tiny", "--items", "16", "--rows", "4", "--refill_rows", "2", "--kv_chunk", "4"]
    + ["--max_new_tokens", "12", "--median_len", "4", "--step_rows", "2", "--budget", "256"]
    + ["--repeats", "1", "--skip", "c"]
  )
  out = capsys.readouterr().out
  assert re.search(r"static .*tok/s.*\d+ steps, 4 prefills of 4.*identical to static 16/16", out)
  assert re.search(r"queue .*tok/s.*\d+ steps, \d+ prefills of 2.*identical to static 16/16", out)
  steps = [int(x) for x in re.findall(r"(\d+) steps, \d+ prefills", out)]
  assert steps[1] < steps[0]  # the queue refills rows: fewer steps than the static batches
  assert re.search(r"bucketed: 5% [0-9.]+ ms.*5%/100% = [0-9.]+; compile [0-9.]+ s", out)
  assert re.search(r"bucketed / dense: step 5% [0-9.]+, .*; compile [0-9.]+", out)


@pytest.mark.slow
def test_unit_speed_child_times_evaluation_and_es_steps(capsys):
  # One layout in this process (the script runs each in a fresh one), on the tiny model.
  tiny = ["model.source=random", "model.preset=tiny-llama", "data.prompts_per_step=2"]
  tiny += ["es.population_size=4", "es.max_new_tokens=4", "eval.max_new_tokens=4"]
  tiny += ["eval.batch_size=6", "eval.num_samples=2", "eval.ks=(1, 2)", "mesh.pop=1"]
  args = unit_speed.parse(["--problems=2", "--_child=old", *[f"--set={s}" for s in tiny]])
  args.es_layouts = "old"
  result = unit_speed.child(args)
  assert result["decode"] == {"kv_chunk": 0, "compactions": 0}  # the old layout's overrides
  assert result["eval_samples"] == 2 * 2 and result["eval_seconds"] > result["eval_compile"] > 0
  assert len(result["es_steps"]) == 2 and result["es_completions"] == 4 * 2
  unit_speed.report({"old": result})
  out = capsys.readouterr().out
  assert re.search(r"evaluation: 4 samples in [0-9.]+ s .*s per 1,000 samples; v1 234-322", out)
  assert re.search(r"ES: steps .*: [0-9.]+ s per 256 completions; v1 111: [0-9.]+x faster", out)
