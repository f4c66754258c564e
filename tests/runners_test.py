"""End-to-end tests of the experiment runners on the configs' `:smoke` variants (random tiny model,
bundled SmolLM2 tokenizer, offline data): outputs, exact resume after SIGKILL, SIGTERM,
corrupt-latest recovery, sequential stage boundary, config validation."""

import functools
import itertools
import json
import os
import shutil
import signal

import numpy as np
import pytest
from run_configs import (
  assert_resumed_steps_trained,
  assert_run_outputs,
  assert_trained,
  checkpoint_params,
  smoke_config,
  with_fields,
)

from es_jax import rewards
from es_jax.decode import sampling
from es_jax.persist import integrity, preemption
from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import deepscaler_hard, gsm8k_easy
from experiments.configs import demo as demo_config
from experiments.evaluation import data as eval_data
from experiments.evaluation import evaluate
from experiments.evaluation import tasks as eval_tasks
from experiments.infra.logger import read_metrics
from experiments.runners import es_runner, grpo_runner, run_data, sequential, train_loop
from experiments.schema.check import ConfigError
from experiments.studies import demo

_config = smoke_config


@pytest.mark.slow
def test_demo_smoke_runs_every_method_and_writes_report(tmp_path):
  # In bf16, as the paper's checkpoints: ES and GRPO train float32 masters, the export is bf16.
  config = _config(demo_config, model__dtype="bfloat16")
  result = demo.run(config, str(tmp_path))
  assert result["stopped"] is False
  for name in ("es", "grpo"):
    rows = assert_run_outputs(str(tmp_path / name), str(tmp_path / name / "checkpoints"))
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == config[name].num_steps
    _, saved = checkpoint_params(str(tmp_path / name / "checkpoints"))
    assert {a.dtype for a in saved.values()} == {np.dtype(np.float32)}
    assert json.load(open(tmp_path / name / "hf" / "config.json"))["dtype"] == "bfloat16"
    # Each step logs the part of its seconds spent compiling (experiments.infra.compile_cache).
    timed = [r for r in rows if "step_seconds" in r]
    assert len(timed) == config[name].num_steps
    assert all(0.0 <= r["compile_seconds"] <= r["step_seconds"] for r in timed), name
  for name, (m1, m2) in (("grpo_es", ("grpo", "es")), ("es_grpo", ("es", "grpo"))):
    workdir = tmp_path / name
    assert_run_outputs(str(workdir), str(workdir / f"stage2_{m2}" / "checkpoints"))
    rows = [r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["step"] > 0]
    assert {r["stage"] for r in rows} == {f"1_{m1}", f"2_{m2}"}
    # train/samples: cumulative completions, continued by the second stage.
    n1, n2 = sequential.split_budget(config.sequential.total_steps, 0.5)
    per_step = [run_data.samples_per_step(config, m) for m in (m1, m2)]
    total = n1 * per_step[0] + n2 * per_step[1]
    samples = [r["train/samples"] for r in rows if "train/samples" in r]
    assert samples == sorted(set(samples)) and samples[-1] == total
    assert all(isinstance(r["train/reward"], float) for r in rows if "train/samples" in r)
  # A few training completions per step, each with the reward its text scores (char_parity).
  parity = rewards.get_reward("char_parity")
  for name, stages in (("es", {None}), ("grpo", {None}), ("es_grpo", {"1_es", "2_grpo"})):
    lines = _lines(tmp_path / name / "samples.jsonl")
    steps = sorted({r["step"] for r in read_metrics(str(tmp_path / name)) if r["step"] > 0})
    assert [ln["step"] for ln in lines] == [s for s in steps for _ in range(config.log_samples)]
    assert {ln["stage"] for ln in lines} == stages
    for ln in lines:
      assert ln["reward"] == pytest.approx(parity(ln["completion"], {})), (name, ln)
      assert ln["prompt"] and ("advantage" in ln if ln["method"] == "grpo" else "fitness" in ln)
  assert len({ln["completion"] for ln in _lines(tmp_path / "es" / "samples.jsonl")}) > 1
  # The final evaluation keeps its first problems' completions (eval.keep_samples).
  (samples,) = [f for f in os.listdir(tmp_path / "es" / "eval") if f.endswith(".samples.jsonl")]
  kept = _lines(tmp_path / "es" / "eval" / samples)
  assert len(kept) == min(config.eval.keep_samples, config.eval.limit)
  assert all(len(ln["samples"]) == config.eval.num_samples and ln["greedy"] for ln in kept)
  # The base evaluation records its config, versions and model like a training run.
  assert json.load(open(tmp_path / "base" / "config.json"))["method"] == "evaluate"
  assert "git_commit" in json.load(open(tmp_path / "base" / "versions.json"))
  (meta,) = [f for f in os.listdir(tmp_path / "base" / "eval") if f.endswith(".meta.json")]
  run_info = json.load(open(tmp_path / "base" / "eval" / meta))["run_info"]
  assert run_info["model"]["preset"] == config.model.preset
  report = open(tmp_path / "report.md").read()
  head = next(ln for ln in report.splitlines() if ln.startswith("| method |"))
  head = [c.strip() for c in head.strip("|").split("|")]
  for name, label, steps in (
    ("base", "base", "n/a"),
    ("es", "ES", "3"),
    ("grpo", "GRPO", "3"),
    ("grpo_es", "GRPO→ES", "2+2"),
    ("es_grpo", "ES→GRPO", "2+2"),
  ):
    line = next(ln for ln in report.splitlines() if ln.startswith(f"| {label} |"))
    row = dict(zip(head, [c.strip() for c in line.strip("|").split("|")], strict=True))
    macro = json.load(open(tmp_path / name / "eval" / "table.json"))["macro"]
    assert row["steps"] == steps
    for col, key in (("Pass@1", "pass@1"), ("Pass@2", "pass@2"), ("greedy", "greedy")):
      assert row[col].startswith(f"{macro[key]:.3f}"), (label, col, row[col])
    assert row["eval min"] != "n/a" and float(row["eval min"]) >= 0.0
    if name != "base":
      # A smoke run can train in under 3 s, which the table rounds to 0.0 minutes.
      assert float(row["train min"]) >= 0.0, (label, row["train min"])
      assert float(row["drift"]) > 0.0, (label, row["drift"])
      assert 0.0 <= float(row["compile s"]) <= 60.0 * (float(row["train min"]) + 0.05) + 0.05
  # Rerun: every run is finished; the report is rebuilt from the same files, minutes included.
  table = [ln for ln in report.splitlines() if ln.startswith("| ")]
  demo.run(config, str(tmp_path))
  rebuilt = open(tmp_path / "report.md").read().splitlines()
  assert [ln for ln in rebuilt if ln.startswith("| ")] == table
  for png in ("pareto.png", "pass_at_k.png", "entropy.png", "reward.png"):
    assert os.path.getsize(tmp_path / png) > 1000


@pytest.mark.slow
def test_es_in_place_arithmetic_trains_bf16_weights(tmp_path):
  # An in-place bf16 scheme (es_jax.es.reference_arithmetic) end to end; the weights stay bf16 and
  # move (residues and the update). The runner takes every scheme down the same path (the scheme
  # is a static argument of its update); reference_arithmetic_test checks each scheme's numbers.
  arithmetic = "bf16_shared_noise"
  quiet = dict(eval__every=0, eval__final=False, export_hf=False)
  modes = dict(es__master_dtype="", es__arithmetic=arithmetic)
  ref = dict(method="es", es__rank=0, **modes, **quiet)
  config = _config(demo_config, model__dtype="bfloat16", es__num_steps=2, **ref)
  es_runner.run(config, str(tmp_path))
  _, saved = checkpoint_params(str(tmp_path / "checkpoints"))
  assert {a.dtype.name for a in saved.values()} == {"bfloat16"}
  assert_trained(str(tmp_path), saved, dtype="bfloat16")  # moved from the bf16 base weights
  with pytest.raises(ValueError, match="es.optimizer"):
    es_runner.run(_config(demo_config, es__optimizer="adam", **ref), str(tmp_path / "adam"))


@pytest.mark.parametrize(
  "module, method", [(gsm8k_easy, "es"), (deepscaler_hard, "grpo")], ids=["gsm8k_es", "hard_grpo"]
)
def test_paper_config_smoke(tmp_path, module, method):
  # A held-out extra task in the final evaluation (macro-averaged with the main one), and one
  # reported separately (average=False: a row, not in the average).
  extra = (
    {"task": "reasoning_gym/chain_sum", "limit": 2, "label": "held_out"},
    {"task": "reasoning_gym/chain_sum", "limit": 3, "label": "separate", "average": False},
  )
  config = _config(
    module,
    method=method,
    data__data_dir=str(tmp_path / "tfds"),
    eval__data_dir=str(tmp_path / "tfds"),
    eval__extra_tasks=extra,
  )
  runner = {"es": es_runner.run, "grpo": grpo_runner.run}[method]
  result = runner(config, str(tmp_path / "run"))
  assert result["stopped"] is False
  assert_run_outputs(str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints"))
  table = json.load(open(tmp_path / "run" / "eval" / "table.json"))
  main_label = eval_tasks.task_label(config.eval.task)
  assert set(table["tasks"]) == {main_label, "held_out", "separate"}
  assert table["tasks"]["held_out"]["num_problems"] == 2
  assert table["macro_tasks"] == [main_label, "held_out"]
  assert table["macro"]["num_problems"] == table["tasks"][main_label]["num_problems"] + 2
  per_task = [table["tasks"][t]["pass@1"] for t in (main_label, "held_out")]
  np.testing.assert_allclose(table["macro"]["pass@1"], np.mean(per_task), rtol=1e-6)
  md = (tmp_path / "run" / "eval" / "table.md").read_text()
  assert f"| macro average ({main_label}, held_out) |" in md and "| separate (not averaged) |" in md


def test_extra_eval_tasks_bad_entries_name_the_field():
  ev = _config(demo_config).eval
  extra_eval_tasks = functools.partial(
    eval_data.extra_eval_tasks, heldout=eval_data.Heldout(frozenset())
  )
  specs = extra_eval_tasks(
    {**ev, "extra_tasks": ("reasoning_gym/chain_sum",), "limit": 3}, taken=set()
  )
  assert [(s.label, s.task, len(s.examples), s.average) for s in specs] == [
    ("reasoning_gym_chain_sum", "reasoning_gym/chain_sum", 3, True)
  ]
  entry = {"task": "reasoning_gym/chain_sum", "limit": 2, "average": False}
  (spec,) = extra_eval_tasks({**ev, "extra_tasks": (entry,)}, taken=set())
  assert spec.average is False and len(spec.examples) == 2
  for entries, field in (
    (({"split": "test"},), r"eval.extra_tasks\[0\].task"),
    (("reasoning_gym/chain_sum", {"task": "reasoning_gym/chain_sum"}), r"extra_tasks\[1\].label"),
    (({"task": "gsm8k", "splt": "test"},), r"eval.extra_tasks\[0\].*splt"),
    ((3,), r"eval.extra_tasks\[0\]"),
    (({"task": "gsm8k", "average": "no"},), r"eval.extra_tasks\[0\].average='no'"),
  ):
    with pytest.raises(ValueError, match=field):
      extra_eval_tasks({**ev, "extra_tasks": entries}, taken=set())
  main = {eval_tasks.task_label(ev.task)}
  with pytest.raises(ValueError, match=r"extra_tasks\[0\].label"):  # clashes with the main task
    extra_eval_tasks({**ev, "extra_tasks": (ev.task,)}, taken=main)


def test_batch_indices_cover_each_epoch_once():
  n, p = 10, 4
  seen = np.concatenate(
    [run_data.batch_indices(n, step=s, batch=p, seed=3, shuffle=True) for s in range(5)]
  )  # 20 positions = 2 epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
  again = run_data.batch_indices(n, step=2, batch=p, seed=3, shuffle=True)
  np.testing.assert_array_equal(again, seen[8:12])
  assert list(run_data.batch_indices(n, step=1, batch=p, seed=3, shuffle=False)) == [4, 5, 6, 7]


def test_split_budget_and_bad_values():
  assert sequential.split_budget(10, 0.5) == (5, 5)
  assert sequential.split_budget(3, 0.9) == (2, 1)
  # The runners trust a validated config: its values are refused by validation, naming the field.
  for field, value in (("sequential__first_fraction", 1.0), ("es__optimizer", "lion")):
    with pytest.raises(ValueError, match=field.replace("__", ".")):
      sequential.run(_config(demo_config, **{field: value}), "/nonexistent/workdir")
  with pytest.raises(ValueError, match="config.es.sigma=-1.0"):
    es_runner.run(_config(demo_config, es__sigma=-1.0), "/nonexistent/workdir")


def _sequential_config():
  return _config(
    demo_config, method="sequential", eval__every=0, eval__final=False, export_hf=False
  )


@pytest.fixture(scope="module")
def sequential_reference(tmp_path_factory):
  """An uninterrupted GRPO→ES smoke run (2 + 2 steps, in process): its workdir and final params."""
  workdir = tmp_path_factory.mktemp("sequential_reference")
  sequential.run(_sequential_config(), str(workdir))
  _, final = checkpoint_params(str(workdir / "stage2_es" / "checkpoints"))
  assert_trained(str(workdir), final)  # so comparing weights shows something
  return workdir, final


@pytest.mark.slow
def test_decode_layout_reaches_every_training_decode_and_moves_no_weight(
  tmp_path, monkeypatch, sequential_reference
):
  """config.decode (chunked cache reads, batch compaction) is what the GRPO rollout and the ES
  population decode with, and it changes no token: the run ends on the dense run's weights."""
  layouts = []
  decode = sampling.decode

  def spy(weights, prompt_ids, prompt_mask, key, decoding, **kwargs):
    # prompt ids: [P·G, S] or [M, P, S]
    layouts.append((decoding.kv_chunk, decoding.compactions, prompt_ids.shape))
    return decode(weights, prompt_ids, prompt_mask, key, decoding, **kwargs)

  monkeypatch.setattr(sampling, "decode", spy)
  config = with_fields(_sequential_config(), decode__kv_chunk=4, decode__compactions=2)
  sequential.run(config, str(tmp_path))
  assert {(k, c) for k, c, _ in layouts} == {(4, 2)}
  assert {len(shape) for *_, shape in layouts} == {2, 3}  # the rollout's rows and the members'
  _, final = sequential_reference  # trained: rewards varied, weights moved (the fixture checks)
  _, laid_out = checkpoint_params(str(tmp_path / "stage2_es" / "checkpoints"))
  for k in final:
    np.testing.assert_array_equal(laid_out[k], final[k], err_msg=k)


def _sigterm_at_step(monkeypatch, stage: str, step: int) -> None:
  """This process gets SIGTERM as local step `step` of stage `stage` (label or method) starts."""
  steps = train_loop.Loop.steps

  def signalling(loop):
    for s in steps(loop):
      if (loop.stage.label or loop.stage.name) == stage and s == step:
        os.kill(os.getpid(), signal.SIGTERM)
      yield s

  monkeypatch.setattr(train_loop.Loop, "steps", signalling)


def _sigterm_before_eval_batch(monkeypatch, k: int) -> None:
  """This process gets SIGTERM before the k-th computed batch of an evaluation."""
  evaluate_tasks = evaluate.evaluate_tasks

  def signalling(*args, should_stop, **kwargs):
    calls = itertools.count(1)

    def stop():
      if next(calls) == k:
        os.kill(os.getpid(), signal.SIGTERM)
      return should_stop()

    return evaluate_tasks(*args, should_stop=stop, **kwargs)

  monkeypatch.setattr(evaluate, "evaluate_tasks", signalling)


@pytest.mark.slow
def test_sequential_sigterm_in_last_step_of_stage_one(tmp_path, monkeypatch, sequential_reference):
  # SIGTERM arrives during stage one's last step (sent as step 2 starts): the step finishes and is
  # saved, stage two is not started, and a rerun ends as an uninterrupted run.
  _sigterm_at_step(monkeypatch, "1_grpo", 2)
  previous = signal.getsignal(signal.SIGTERM)
  result = sequential.run(_sequential_config(), str(tmp_path))
  assert result == {"stopped": True}
  assert signal.getsignal(signal.SIGTERM) == previous  # the run's handler is gone again
  stage1 = Checkpointer(str(tmp_path / "stage1_grpo" / "checkpoints"), async_save=False)
  assert stage1.all_steps() == [1, 2]
  assert not (tmp_path / "stage2_es").exists() and not (tmp_path / "DONE").exists()
  assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]
  monkeypatch.undo()
  assert sequential.run(_sequential_config(), str(tmp_path))["stopped"] is False
  assert (tmp_path / "DONE").exists()
  _, resumed = checkpoint_params(str(tmp_path / "stage2_es" / "checkpoints"))
  _, final = sequential_reference
  for k in final:
    np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)


def test_sigterm_during_startup_stops_before_the_first_step(tmp_path):
  with preemption.sigterm_scope() as preempt:  # the CLI's scope, as main() holds it
    preempt.requested = True  # as if SIGTERM arrived while the model and data were loading
    assert es_runner.run(_config(demo_config, method="es"), str(tmp_path)) == {"stopped": True}
  assert not Checkpointer(str(tmp_path / "checkpoints"), async_save=False).all_steps()
  assert not (tmp_path / "DONE").exists() and not (tmp_path / "eval").exists()


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_sigterm_in_final_evaluation_stops_between_batches(tmp_path, monkeypatch):
  # The evaluation: 4 problems in 2 blocks. SIGTERM before the second: the first block's records
  # stay in eval/*.jsonl, nothing is exported, no DONE; a rerun evaluates the other block only
  # (that a resumed evaluation equals an uninterrupted one: evaluate_test).
  config = _config(demo_config, method="es", es__num_steps=1, eval__every=0, eval__batch_size=2)
  _sigterm_before_eval_batch(monkeypatch, 2)
  assert es_runner.run(config, str(tmp_path)) == {"stopped": True}
  jsonl = tmp_path / "eval" / f"{eval_tasks.task_label(config.eval.task)}.jsonl"
  first = _lines(jsonl)
  assert [r["index"] for r in first] == [0, 1]
  samples = jsonl.with_name(jsonl.stem + ".samples.jsonl")
  assert [r["index"] for r in _lines(samples)] == [0, 1]
  assert not (tmp_path / "eval" / "table.json").exists()
  assert not (tmp_path / "hf").exists() and not (tmp_path / "DONE").exists()
  monkeypatch.undo()
  assert es_runner.run(config, str(tmp_path))["stopped"] is False
  assert (tmp_path / "DONE").exists() and (tmp_path / "hf" / "config.json").exists()
  records = _lines(jsonl)
  assert records[:2] == first and [r["index"] for r in records] == [0, 1, 2, 3]
  assert [r["index"] for r in _lines(samples)] == [0, 1, 2, 3]  # none written twice
  assert json.load(open(tmp_path / "eval" / "table.json"))["macro"]["num_problems"] == 4
  # Extended to 2 steps: the 1-step model's evaluation is set aside (kept, not reused).
  longer = _config(demo_config, method="es", es__num_steps=2, eval__every=0, eval__batch_size=2)
  assert es_runner.run(longer, str(tmp_path))["stopped"] is False
  meta = f"{eval_tasks.task_label(config.eval.task)}.meta.json"
  digests = [
    json.load(open(tmp_path / d / meta))["run_info"]["params_digest"]
    for d in ("eval.stale-1", "eval")
  ]
  for step, digest in zip((1, 2), digests, strict=True):
    with Checkpointer(str(tmp_path / "checkpoints"), async_save=False) as ckpt:
      state = ckpt.restore(step).state
    params = state["params"] if isinstance(state, dict) and "params" in state else state[0]
    assert integrity.tree_digest(params) == digest, step
  assert digests[0] != digests[1]
  assert len(_lines(jsonl)) == 4 and _lines(tmp_path / "eval.stale-1" / jsonl.name) == records


@pytest.mark.slow
def test_sequential_resume_inside_stage_two_does_not_rerun_stage_one(
  tmp_path, monkeypatch, sequential_reference
):
  config = _sequential_config()
  shutil.copytree(sequential_reference[0], tmp_path, dirs_exist_ok=True)
  stage2 = tmp_path / "stage2_es" / "checkpoints"
  final = sequential_reference[1]
  before = read_metrics(str(tmp_path / "metrics.jsonl"))
  # Resume inside stage two: drop its last checkpoint (step 2 of 2), keep step 1.
  shutil.rmtree(stage2 / "2")
  _, restored = checkpoint_params(str(stage2), step=1)
  calls = {"grpo": 0, "es": 0}
  real_rollout = grpo_runner.grpo_update.rollout
  real_eval = es_runner.population.evaluate_population

  def count(name, fn):
    def wrapped(*a, **k):
      calls[name] += 1
      return fn(*a, **k)

    return wrapped

  monkeypatch.setattr(grpo_runner.grpo_update, "rollout", count("grpo", real_rollout))
  monkeypatch.setattr(es_runner.population, "evaluate_population", count("es", real_eval))
  sequential.run(config, str(tmp_path))
  assert calls == {"grpo": 0, "es": 1}  # stage one restored, one stage-two step rerun
  _, resumed = checkpoint_params(str(stage2))
  for k in final:
    np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)
  after = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in after] == [r["step"] for r in before]
  # Stage one's lines are the original ones (not rewritten), stage two's last line is new.
  assert [r["time"] for r in after if r["stage"] == "1_grpo"] == [
    r["time"] for r in before if r["stage"] == "1_grpo"
  ]
  stage_two = [r for r in after if r["stage"] != "1_grpo"]
  assert len(stage_two) == 2  # its step 1 kept, step 2 rerun from checkpoint 1
  assert_resumed_steps_trained(stage_two, stage_two[0]["step"], restored, resumed)


def test_an_error_inside_a_step_is_not_reported_as_a_config_error(tmp_path, monkeypatch):
  # A ValueError raised while a step runs (a reward returning the wrong shape, bad data) is
  # reported as itself; only the config's own errors are ConfigErrors ("config.es: ...").
  def broken(*args, **kwargs):
    raise ValueError("score_fn returned shape (3,) for member 0, expected (4,)")

  monkeypatch.setattr(es_runner.population, "evaluate_population", broken)
  config = _config(
    demo_config, method="es", es__num_steps=1, eval__every=0, eval__final=False, export_hf=False
  )
  with pytest.raises(ValueError, match="score_fn returned shape") as info:
    es_runner.run(config, str(tmp_path))
  assert not isinstance(info.value, ConfigError) and not str(info.value).startswith("config.")
  config.es.antithetic, config.es.population_size = True, 3
  with pytest.raises(ConfigError, match=r"config.es.population_size=3 is odd"):
    es_runner.noise_spec(config.es)


@pytest.mark.slow
def test_grpo_step_errors_are_themselves_and_config_errors_name_the_field(tmp_path, monkeypatch):
  # GRPO as ES above: a ValueError from inside a step is not relabelled "config.grpo: ...".
  def broken(*args, **kwargs):
    raise ValueError("rollout: prompt_ids (4, 3) and prompt_mask (4, 2) must be equal [P, Sp]")

  monkeypatch.setattr(grpo_runner.grpo_update, "rollout", broken)
  quiet = dict(eval__every=0, eval__final=False, export_hf=False)
  config = _config(demo_config, method="grpo", grpo__num_steps=1, **quiet)
  with pytest.raises(ValueError, match="rollout: prompt_ids") as info:
    grpo_runner.run(config, str(tmp_path))
  assert not isinstance(info.value, ConfigError) and not str(info.value).startswith("config.")
  # The config's own values are checked before the first step, each error naming its field.
  bad = _config(demo_config, method="grpo", grpo__eps_low=1.5)
  with pytest.raises(ConfigError, match=r"^config\.grpo\.eps_low=1\.5 must be in \[0, 1\)"):
    grpo_runner.update_settings(bad)
  config = _config(demo_config, method="grpo")  # mini-batch: prompts_per_step x G rows
  rows = config.data.prompts_per_step * config.grpo.num_generations
  assert grpo_runner.update_settings(config).mini_batch_size == rows
  with pytest.raises(ConfigError, match=r"^config\.grpo\.micro_batch_size=2 is invalid"):
    grpo_runner.update_settings(config, devices=rows + 1)
  with pytest.raises(ConfigError, match=r"^config\.grpo\.temperature=-1\.0 must be"):
    grpo_runner.decoding(_config(demo_config, grpo__temperature=-1.0).grpo, (0,), 0)
