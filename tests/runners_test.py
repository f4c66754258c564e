"""End-to-end tests of the experiment runners on the configs' `:smoke` variants (random tiny model,
bundled SmolLM2 tokenizer, offline data): outputs, exact resume after SIGKILL, SIGTERM,
corrupt-latest recovery, sequential stage boundary, config validation."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from run_configs import smoke_config

from es_jax import checkpoint, models
from es_jax.checkpoint import Checkpointer
from experiments import demo, es, grpo, sequential, train_lib
from experiments.configs import deepscaler_hard, gsm8k_easy
from experiments.configs import demo as demo_config
from experiments.logger import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_config = smoke_config


def _finite_metrics(workdir):
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert rows, "no metrics"
  for r in rows:
    for k, v in r.items():
      if isinstance(v, float):
        assert math.isfinite(v), (k, r["step"])
  return rows


def _params(ckpt_dir, step=None):
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    restored = ckpt.restore(step)
  finally:
    ckpt.close()
  state = restored.state
  params = state["params"] if isinstance(state, dict) and "params" in state else state[0]
  return restored.meta["step"], {"/".join(map(str, k)): np.asarray(v) for k, v in _leaves(params)}


def _leaves(tree, prefix=()):
  if isinstance(tree, dict):
    for k in sorted(tree):
      yield from _leaves(tree[k], (*prefix, k))
  else:
    yield prefix, tree


def _assert_trained(workdir, params, dtype=None):
  """The run's rewards varied (across ES members or GRPO samples) and its weights left the base
  model's: only then does comparing two runs' weights show anything. Smoke configs score with
  es_jax.rewards.synthetic.char_parity, which varies on a random model."""
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  spread = [r.get("fitness/std", r.get("reward/std", 0.0)) for r in rows if r["step"] > 0]
  assert spread and max(spread) > 0, "rewards never varied"
  model, _ = train_lib.load_model(_config(demo_config).model, seed=0)
  base = models.params(model) if dtype is None else models.cast_params(models.params(model), dtype)
  base = {"/".join(map(str, k)): np.asarray(v) for k, v in _leaves(base)}
  assert set(base) == set(params)
  assert any(not np.array_equal(params[k], base[k]) for k in params), "weights never moved"


def _assert_run_outputs(workdir, ckpt_dir):
  assert os.path.exists(os.path.join(workdir, "DONE"))
  assert Checkpointer(ckpt_dir, async_save=False).all_steps()
  rows = _finite_metrics(workdir)
  assert rows[0]["step"] == 0 and "eval/pass@1" in rows[0]  # the base model's periodic eval
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  table = json.load(open(os.path.join(workdir, "eval", "table.json")))
  assert 0.0 <= table["macro"]["pass@1"] <= 1.0
  for name in ("reward.png", "entropy.png", os.path.join("eval", "pass_at_k.png")):
    assert os.path.getsize(os.path.join(workdir, name)) > 1000
  assert os.path.exists(os.path.join(workdir, "hf", "config.json"))
  assert json.load(open(os.path.join(workdir, "config.json")))["method"]
  # Where the examples came from: source directory, the files' SHA-256, rows used.
  sources = json.load(open(os.path.join(workdir, "versions.json")))["data"]
  assert sources["data"]["used"] > 0 and sources["eval"]["used"] > 0
  for s in sources.values():
    assert s.get("generator") == "reasoning_gym" or (s["source_dir"] and s["rows"] >= s["used"])
  return rows


def test_demo_smoke_runs_every_method_and_writes_report(tmp_path):
  # In bf16, as the paper's checkpoints: ES and GRPO train float32 masters, the export is bf16.
  config = _config(demo_config, model__dtype="bfloat16")
  result = demo.run(config, str(tmp_path))
  assert result["stopped"] is False
  for name in ("es", "grpo"):
    rows = _assert_run_outputs(str(tmp_path / name), str(tmp_path / name / "checkpoints"))
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == config[name].num_steps
    _, saved = _params(str(tmp_path / name / "checkpoints"))
    assert {a.dtype for a in saved.values()} == {np.dtype(np.float32)}
    assert json.load(open(tmp_path / name / "hf" / "config.json"))["dtype"] == "bfloat16"
  for name, (m1, m2) in (("grpo_es", ("grpo", "es")), ("es_grpo", ("es", "grpo"))):
    workdir = tmp_path / name
    _assert_run_outputs(str(workdir), str(workdir / f"stage2_{m2}" / "checkpoints"))
    rows = [r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["step"] > 0]
    assert {r["stage"] for r in rows} == {f"1_{m1}", f"2_{m2}"}
    # train/samples: cumulative completions, continued by the second stage.
    n1, n2 = sequential.split_budget(config.sequential.total_steps, 0.5)
    per_step = [train_lib.samples_per_step(config, m) for m in (m1, m2)]
    total = n1 * per_step[0] + n2 * per_step[1]
    samples = [r["train/samples"] for r in rows if "train/samples" in r]
    assert samples == sorted(set(samples)) and samples[-1] == total
    assert all(isinstance(r["train/reward"], float) for r in rows if "train/samples" in r)
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
      assert float(row["train min"]) > 0.0 and float(row["drift"]) > 0.0
  # Rerun: every run is finished; the report is rebuilt from the same files, minutes included.
  table = [ln for ln in report.splitlines() if ln.startswith("| ")]
  demo.run(config, str(tmp_path))
  rebuilt = open(tmp_path / "report.md").read().splitlines()
  assert [ln for ln in rebuilt if ln.startswith("| ")] == table
  for png in ("pareto.png", "pass_at_k.png", "entropy.png", "reward.png"):
    assert os.path.getsize(tmp_path / png) > 1000


def test_es_reference_precision_trains_bf16_weights(tmp_path):
  # es.precision="reference": the reference code's bf16 arithmetic end to end; the weights stay
  # bf16 and move (residues and the member-by-member update).
  quiet = dict(eval__every=0, eval__final=False, export_hf=False)
  ref = dict(method="es", es__precision="reference", es__rank=0, **quiet)
  config = _config(demo_config, model__dtype="bfloat16", es__num_steps=2, **ref)
  es.run(config, str(tmp_path))
  _, saved = _params(str(tmp_path / "checkpoints"))
  assert {a.dtype.name for a in saved.values()} == {"bfloat16"}
  _assert_trained(str(tmp_path), saved, dtype="bfloat16")  # moved from the bf16 base weights
  with pytest.raises(ValueError, match="es.optimizer"):
    es.run(_config(demo_config, es__optimizer="adam", **ref), str(tmp_path / "adam"))


@pytest.mark.parametrize(
  "module, method", [(gsm8k_easy, "es"), (deepscaler_hard, "grpo")], ids=["gsm8k_es", "hard_grpo"]
)
def test_paper_config_smoke(tmp_path, module, method):
  # A held-out extra task in the final evaluation (macro-averaged with the main one).
  extra = ({"task": "reasoning_gym/chain_sum", "limit": 2, "label": "held_out"},)
  config = _config(
    module,
    method=method,
    data__data_dir=str(tmp_path / "tfds"),
    eval__data_dir=str(tmp_path / "tfds"),
    eval__extra_tasks=extra,
  )
  runner = {"es": es.run, "grpo": grpo.run}[method]
  result = runner(config, str(tmp_path / "run"))
  assert result["stopped"] is False
  _assert_run_outputs(str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints"))
  table = json.load(open(tmp_path / "run" / "eval" / "table.json"))
  main_label = train_lib.task_label(config.eval.task)
  assert set(table["tasks"]) == {main_label, "held_out"}
  assert table["tasks"]["held_out"]["num_problems"] == 2
  per_task = [table["tasks"][t]["pass@1"] for t in table["tasks"]]
  np.testing.assert_allclose(table["macro"]["pass@1"], np.mean(per_task), rtol=1e-6)


def test_extra_eval_tasks_bad_entries_name_the_field():
  ev = _config(demo_config).eval
  specs = train_lib.extra_eval_tasks(
    {**ev, "extra_tasks": ("reasoning_gym/chain_sum",), "limit": 3}, taken=set()
  )
  assert [(s.label, s.task, len(s.examples)) for s in specs] == [
    ("reasoning_gym_chain_sum", "reasoning_gym/chain_sum", 3)
  ]
  for entries, field in (
    (({"split": "test"},), r"eval.extra_tasks\[0\].task"),
    (("reasoning_gym/chain_sum", {"task": "reasoning_gym/chain_sum"}), r"extra_tasks\[1\].label"),
    (({"task": "gsm8k", "splt": "test"},), r"eval.extra_tasks\[0\].*splt"),
    ((3,), r"eval.extra_tasks\[0\]"),
  ):
    with pytest.raises(ValueError, match=field):
      train_lib.extra_eval_tasks({**ev, "extra_tasks": entries}, taken=set())
  main = {train_lib.task_label(ev.task)}
  with pytest.raises(ValueError, match=r"extra_tasks\[0\].label"):  # clashes with the main task
    train_lib.extra_eval_tasks({**ev, "extra_tasks": (ev.task,)}, taken=main)


def test_batch_indices_cover_each_epoch_once():
  n, p = 10, 4
  seen = np.concatenate(
    [train_lib.batch_indices(n, step=s, batch=p, seed=3, shuffle=True) for s in range(5)]
  )  # 20 positions = 2 epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
  again = train_lib.batch_indices(n, step=2, batch=p, seed=3, shuffle=True)
  np.testing.assert_array_equal(again, seen[8:12])
  assert list(train_lib.batch_indices(n, step=1, batch=p, seed=3, shuffle=False)) == [4, 5, 6, 7]


def test_split_budget_and_bad_values():
  assert sequential.split_budget(10, 0.5) == (5, 5)
  assert sequential.split_budget(3, 0.9) == (2, 1)
  with pytest.raises(ValueError, match="sequential.first_fraction"):
    sequential.split_budget(10, 1.0)
  with pytest.raises(ValueError, match="es.optimizer"):
    es.make_optimizer(_config(demo_config, es__optimizer="lion").es)
  with pytest.raises(ValueError, match="sigma"):
    es.make_optimizer(_config(demo_config, es__sigma=-1.0).es)


def _sequential_config():
  return _config(
    demo_config, method="sequential", eval__every=0, eval__final=False, export_hf=False
  )


@pytest.fixture(scope="module")
def sequential_reference(tmp_path_factory):
  """An uninterrupted GRPO→ES smoke run (2 + 2 steps, in process): its workdir and final params."""
  workdir = tmp_path_factory.mktemp("sequential_reference")
  sequential.run(_sequential_config(), str(workdir))
  _, final = _params(str(workdir / "stage2_es" / "checkpoints"))
  _assert_trained(str(workdir), final)  # so comparing weights shows something
  return workdir, final


def test_sequential_sigterm_in_last_step_of_stage_one(tmp_path, monkeypatch, sequential_reference):
  # SIGTERM arrives during stage one's last step (the test hook sends it as step 2 starts): the
  # step finishes and is saved, stage two is not started, and a rerun ends as an uninterrupted run.
  monkeypatch.setenv("ES_JAX_TEST_SIGTERM_AT", "1_grpo:2")
  previous = signal.getsignal(signal.SIGTERM)
  result = sequential.run(_sequential_config(), str(tmp_path))
  assert result == {"stopped": True}
  assert signal.getsignal(signal.SIGTERM) == previous  # the run's handler is gone again
  stage1 = Checkpointer(str(tmp_path / "stage1_grpo" / "checkpoints"), async_save=False)
  assert stage1.all_steps() == [1, 2]
  assert not (tmp_path / "stage2_es").exists() and not (tmp_path / "DONE").exists()
  assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]
  monkeypatch.delenv("ES_JAX_TEST_SIGTERM_AT")
  assert sequential.run(_sequential_config(), str(tmp_path))["stopped"] is False
  assert (tmp_path / "DONE").exists()
  _, resumed = _params(str(tmp_path / "stage2_es" / "checkpoints"))
  _, final = sequential_reference
  for k in final:
    np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)


def test_sigterm_during_startup_stops_before_the_first_step(tmp_path):
  with checkpoint.sigterm_scope() as preempt:  # the CLI's scope, as main() holds it
    preempt.requested = True  # as if SIGTERM arrived while the model and data were loading
    assert es.run(_config(demo_config, method="es"), str(tmp_path)) == {"stopped": True}
  assert not Checkpointer(str(tmp_path / "checkpoints"), async_save=False).all_steps()
  assert not (tmp_path / "DONE").exists() and not (tmp_path / "eval").exists()


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_sigterm_in_final_evaluation_stops_between_batches(tmp_path, monkeypatch):
  # The evaluation: 4 problems in 2 blocks. SIGTERM before the second: the first block's records
  # stay in eval/*.jsonl, nothing is exported, no DONE; a rerun evaluates the other block only
  # (that a resumed evaluation equals an uninterrupted one: evaluate_test).
  config = _config(demo_config, method="es", es__num_steps=1, eval__every=0, eval__batch_size=2)
  monkeypatch.setenv("ES_JAX_TEST_SIGTERM_AT", "eval:2")
  assert es.run(config, str(tmp_path)) == {"stopped": True}
  jsonl = tmp_path / "eval" / f"{train_lib.task_label(config.eval.task)}.jsonl"
  first = _lines(jsonl)
  assert [r["index"] for r in first] == [0, 1]
  assert not (tmp_path / "eval" / "table.json").exists()
  assert not (tmp_path / "hf").exists() and not (tmp_path / "DONE").exists()
  monkeypatch.delenv("ES_JAX_TEST_SIGTERM_AT")
  assert es.run(config, str(tmp_path))["stopped"] is False
  assert (tmp_path / "DONE").exists() and (tmp_path / "hf" / "config.json").exists()
  records = _lines(jsonl)
  assert records[:2] == first and [r["index"] for r in records] == [0, 1, 2, 3]
  assert json.load(open(tmp_path / "eval" / "table.json"))["macro"]["num_problems"] == 4


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
  calls = {"grpo": 0, "es": 0}
  real_rollout, real_eval = grpo.grpo_train.rollout, es.population.evaluate

  def count(name, fn):
    def wrapped(*a, **k):
      calls[name] += 1
      return fn(*a, **k)

    return wrapped

  monkeypatch.setattr(grpo.grpo_train, "rollout", count("grpo", real_rollout))
  monkeypatch.setattr(es.population, "evaluate", count("es", real_eval))
  sequential.run(config, str(tmp_path))
  assert calls == {"grpo": 0, "es": 1}  # stage one restored, one stage-two step rerun
  _, resumed = _params(str(stage2))
  for k in final:
    np.testing.assert_array_equal(resumed[k], final[k], err_msg=k)
  after = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in after] == [r["step"] for r in before]
  # Stage one's lines are the original ones (not rewritten), stage two's last line is new.
  assert [r["time"] for r in after if r["stage"] == "1_grpo"] == [
    r["time"] for r in before if r["stage"] == "1_grpo"
  ]


# --- subprocess runs: SIGKILL / SIGTERM / corrupt checkpoint ---


def _command(workdir, *overrides):
  return [
    sys.executable,
    "-m",
    "experiments.main",
    f"--config={os.path.join(ROOT, 'experiments', 'configs', 'demo.py')}:smoke",
    f"--workdir={workdir}",
    "--config.progress=False",
    "--config.eval.every=0",
    "--config.eval.final=False",
    "--config.export_hf=False",
    *overrides,
  ]


_COMPILE_CACHE = {}


@pytest.fixture(scope="module", autouse=True)
def _compile_cache(tmp_path_factory):
  """A persistent XLA compilation cache shared by this module's subprocess runs, which would
  otherwise each compile the same programs (about 10 of a run's 25 s on two cores). It changes no
  result: it holds the executables a run would have compiled."""
  _COMPILE_CACHE["dir"] = str(tmp_path_factory.mktemp("jax_compile_cache"))
  yield
  _COMPILE_CACHE.clear()


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  env.pop("XLA_FLAGS", None)
  if "dir" in _COMPILE_CACHE:
    env.update(
      JAX_COMPILATION_CACHE_DIR=_COMPILE_CACHE["dir"],
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
  return env


# Waits on subprocess runs: no fixed timeout (a loaded machine makes runs slow, not hung). A run
# is killed as hung only when neither its output nor its workdir changed for STALL_S seconds,
# times the load (os.getloadavg() per CPU, at least 1); HARD_LIMIT_S bounds a run that keeps
# writing forever.
STALL_S, HARD_LIMIT_S = 120.0, 3600.0


def _load_factor() -> float:
  try:
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
  except OSError:  # no load average on this platform
    return 1.0


def _progress(*paths) -> tuple:
  """(newest mtime, file count, total size) under `paths`: changes while a run makes progress."""
  newest, count, size = 0.0, 0, 0
  for path in paths:
    for root, _, files in os.walk(path) if os.path.isdir(path) else [("", (), (path,))]:
      for f in files:
        try:
          st = os.stat(os.path.join(root, f))
        except OSError:  # removed meanwhile (a checkpoint's temporary files)
          continue
        newest, count, size = max(newest, st.st_mtime), count + 1, size + st.st_size
  return newest, count, size


class _Proc:
  """A `python -m experiments.main` subprocess, its stderr in a file, waited on with progress
  checks (see STALL_S)."""

  def __init__(self, workdir, *overrides):
    self.workdir = workdir
    parent = os.path.dirname(os.path.abspath(workdir))  # a test's tmp dir, not the workdir
    self._log = tempfile.NamedTemporaryFile("w+", suffix=".stderr", dir=parent, delete=False)
    self.proc = subprocess.Popen(
      _command(workdir, *overrides),
      cwd=ROOT,
      env=_env(),
      stdout=self._log,
      stderr=self._log,
      text=True,
    )
    self._t0 = self._seen = time.monotonic()
    self._mark = None

  @property
  def pid(self):
    return self.proc.pid

  @property
  def stderr(self) -> str:
    with open(self._log.name) as f:
      return f.read()

  def alive(self, what="the run") -> bool:
    """Whether it still runs; fails (after killing it) when it stopped progressing."""
    if self.proc.poll() is not None:
      return False
    now, mark = time.monotonic(), _progress(self.workdir, self._log.name)
    if mark != self._mark:
      self._mark, self._seen = mark, now
    stalled = now - self._seen > STALL_S * _load_factor()
    if stalled or now - self._t0 > HARD_LIMIT_S:
      self.proc.kill()
      self.proc.wait()
      reason = f"no progress for {now - self._seen:.0f} s" if stalled else "over the hard limit"
      raise AssertionError(f"{what} in {self.workdir}: {reason}\n{self.stderr[-3000:]}")
    return True

  def wait(self) -> int:
    while self.alive():
      time.sleep(0.2)
    return self.proc.returncode

  def kill(self):
    self.proc.kill()
    self.proc.wait()


def _run(workdir, *overrides):
  run = _Proc(workdir, *overrides)
  assert run.wait() == 0, run.stderr[-3000:]
  return run


def _start_and_signal(workdir, sig, *overrides, after_step=1):
  """Starts a run, sends `sig` once checkpoint `after_step` is committed; returns the _Proc."""
  run = _Proc(workdir, *overrides)
  marker = os.path.join(workdir, "checkpoints", str(after_step), "commit_success.txt")
  while not os.path.exists(marker):
    if not run.alive(f"waiting for checkpoint {after_step}"):
      raise AssertionError(f"run ended before step {after_step}: {run.stderr[-3000:]}")
    time.sleep(0.05)
  run.proc.send_signal(sig)
  return run


def test_second_run_on_a_workdir_in_use_is_refused(tmp_path):
  workdir = str(tmp_path)
  first = _Proc(workdir, "--config.method=es", "--config.es.num_steps=50")
  try:
    lock = os.path.join(workdir, "run.lock")
    while not (os.path.exists(lock) and os.path.getsize(lock)):
      assert first.alive("the first run, before locking"), "first run never locked"
      time.sleep(0.05)
    second = _Proc(workdir, "--config.method=es", "--config.es.num_steps=50")
    assert second.wait() == 2  # a user error: one line, no traceback
    assert "error:" in second.stderr and "Traceback" not in second.stderr
    assert f"pid {first.pid} on host" in second.stderr
    assert first.proc.poll() is None  # the first run goes on
  finally:
    first.kill()


@pytest.fixture(scope="module")
def es_reference(tmp_path_factory):
  """An uninterrupted 4-step ES smoke run (subprocess) and its final params."""
  workdir = str(tmp_path_factory.mktemp("es_reference"))
  _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  step, params = _params(os.path.join(workdir, "checkpoints"))
  _assert_trained(workdir, params)  # so the resume tests compare weights that moved
  return step, params, workdir


def test_es_sigkill_resume_is_bitwise(tmp_path, es_reference):
  workdir = str(tmp_path)
  proc = _start_and_signal(
    workdir, signal.SIGKILL, "--config.method=es", "--config.es.num_steps=4", after_step=2
  )
  assert proc.wait() == -signal.SIGKILL
  _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  step, params = _params(os.path.join(workdir, "checkpoints"))
  ref_step, ref, _ = es_reference
  assert step == ref_step == 4
  for k in ref:
    np.testing.assert_array_equal(params[k], ref[k], err_msg=k)
  steps = [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))]
  assert steps == [1, 2, 3, 4]  # no line lost or repeated by the kill


def test_es_corrupt_latest_checkpoint_resumes_from_previous(tmp_path, es_reference):
  workdir = str(tmp_path / "run")
  shutil.copytree(es_reference[2], workdir)  # a finished 4-step run
  latest = os.path.join(workdir, "checkpoints", "4", "state")
  victim = max(
    (os.path.join(r, f) for r, _, fs in os.walk(latest) for f in fs), key=os.path.getsize
  )
  with open(victim, "r+b") as f:
    f.truncate(os.path.getsize(victim) // 2)
  os.remove(os.path.join(workdir, "DONE"))
  out = _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  assert "CorruptCheckpointWarning" in out.stderr and "checkpoints/4" in out.stderr
  step, params = _params(os.path.join(workdir, "checkpoints"))
  assert step == 4
  for k in es_reference[1]:
    np.testing.assert_array_equal(params[k], es_reference[1][k], err_msg=k)


def test_grpo_sigkill_resume_matches(tmp_path):
  overrides = ("--config.method=grpo", "--config.grpo.num_steps=2")
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "killed")
  _run(ref_dir, *overrides)
  proc = _start_and_signal(workdir, signal.SIGKILL, *overrides, after_step=1)
  proc.wait()
  _run(workdir, *overrides)
  _, ref = _params(os.path.join(ref_dir, "checkpoints"))
  step, params = _params(os.path.join(workdir, "checkpoints"))
  assert step == 2
  _assert_trained(ref_dir, ref)
  for k in ref:
    np.testing.assert_array_equal(params[k], ref[k], err_msg=k)


def test_sigterm_saves_and_exits_zero(tmp_path):
  workdir = str(tmp_path)
  proc = _start_and_signal(
    workdir,
    signal.SIGTERM,
    "--config.method=es",
    "--config.es.num_steps=50",
    "--config.checkpoint.every=10",
    after_step=1,
  )
  assert proc.wait() == 0, proc.stderr[-3000:]
  steps = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False).all_steps()
  assert max(steps) > 1 and max(steps) < 50  # a checkpoint of the step it stopped after
  assert not os.path.exists(os.path.join(workdir, "DONE"))


def test_main_refuses_unknown_key_and_bad_value(tmp_path):
  for override, name in (
    ("--config.es.populaton_size=8", "populaton_size"),
    ("--config.es.sigma=abc", "sigma"),
  ):
    out = _Proc(str(tmp_path), override)
    assert out.wait() != 0 and name in out.stderr, out.stderr[-2000:]


def test_resume_with_another_config_is_refused_but_budget_may_grow(tmp_path):
  config = _config(demo_config, method="es", eval__every=0, eval__final=False, export_hf=False)
  es.run(config, str(tmp_path))
  other = _config(
    demo_config, method="es", eval__every=0, eval__final=False, export_hf=False, seed=1
  )
  with pytest.raises(ValueError, match="config.seed=1"):
    es.run(other, str(tmp_path))
  sigma = _config(
    demo_config,
    method="es",
    eval__every=0,
    eval__final=False,
    export_hf=False,
    es__sigma=0.5,
    es__num_steps=5,
  )
  with pytest.raises(ValueError, match=r"es\.sigma \(0\.001 in the checkpoint, 0\.5 now\)"):
    es.run(sigma, str(tmp_path))
  longer = _config(
    demo_config, method="es", eval__every=0, eval__final=False, export_hf=False, es__num_steps=4
  )  # a larger budget continues the run
  es.run(longer, str(tmp_path))
  assert Checkpointer(str(tmp_path / "checkpoints"), async_save=False).latest_step() == 4

