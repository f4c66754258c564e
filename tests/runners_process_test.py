"""The experiment runners as processes (python -m experiments.main on the `:smoke` configs):
exact resume after SIGKILL, SIGTERM through the CLI, corrupt-latest recovery, the workdir lock,
config refusals. Split from runners_test.py so that pytest-xdist's two workers share the load."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from run_configs import (
  ROOT,
  assert_resumed_steps_trained,
  assert_trained,
  checkpoint_params,
  cli_env,
  smoke_config,
)

from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import demo as demo_config
from experiments.infra.logger import read_metrics
from experiments.runners import es_runner

pytestmark = pytest.mark.slow  # each test runs `python -m experiments.main` processes

_config = smoke_config


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
      env=cli_env(),  # the session's compilation cache and XLA level
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


def _signal_after_checkpoint(run, sig, after_step=1):
  """Sends `sig` to `run` (a _Proc) once its checkpoint `after_step` is committed."""
  marker = os.path.join(run.workdir, "checkpoints", str(after_step), "commit_success.txt")
  while not os.path.exists(marker):
    if not run.alive(f"waiting for checkpoint {after_step}"):
      raise AssertionError(f"run ended before step {after_step}: {run.stderr[-3000:]}")
    time.sleep(0.05)
  run.proc.send_signal(sig)


def _start_and_signal(workdir, sig, *overrides, after_step=1):
  """Starts a run, sends `sig` once checkpoint `after_step` is committed; returns the _Proc."""
  run = _Proc(workdir, *overrides)
  _signal_after_checkpoint(run, sig, after_step)
  return run


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
  """One long ES run (subprocess) shared by the lock and the SIGTERM tests: once it holds the
  workdir's lock a second run on the same workdir is started (and refused); once checkpoint 1 is
  committed it gets SIGTERM. Returns the first run, the second, and whether the first was still
  running when the second had exited."""
  workdir = str(tmp_path_factory.mktemp("long_run"))
  flags = ("--config.method=es", "--config.es.num_steps=100", "--config.checkpoint.every=10")
  first = _Proc(workdir, *flags)
  try:
    lock = os.path.join(workdir, "run.lock")
    while not (os.path.exists(lock) and os.path.getsize(lock)):
      assert first.alive("the first run, before locking"), "first run never locked"
      time.sleep(0.05)
    second = _Proc(workdir, *flags)
    second.wait()
    first_went_on = first.proc.poll() is None
    _signal_after_checkpoint(first, signal.SIGTERM, after_step=1)
    first.wait()
  finally:
    if first.proc.poll() is None:
      first.kill()
  return first, second, first_went_on


def test_second_run_on_a_workdir_in_use_is_refused(long_run):
  first, second, first_went_on = long_run
  assert second.proc.returncode == 2  # a user error: one line, no traceback
  assert "error:" in second.stderr and "Traceback" not in second.stderr
  assert f"pid {first.pid} on host" in second.stderr
  assert first_went_on  # the first run went on


def test_sigterm_saves_and_exits_zero(long_run):
  proc = long_run[0]
  assert proc.proc.returncode == 0, proc.stderr[-3000:]
  steps = Checkpointer(os.path.join(proc.workdir, "checkpoints"), async_save=False).all_steps()
  assert max(steps) > 1 and max(steps) < 100  # a checkpoint of the step it stopped after
  assert not os.path.exists(os.path.join(proc.workdir, "DONE"))
  assert f"the checkpoint of step {max(steps)} is in" in proc.stderr  # says what was saved


@pytest.fixture(scope="module")
def es_reference(tmp_path_factory):
  """An uninterrupted 4-step ES smoke run (subprocess) and its final params."""
  workdir = str(tmp_path_factory.mktemp("es_reference"))
  _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  step, params = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert_trained(workdir, params)  # so the resume tests compare weights that moved
  return step, params, workdir


def test_es_sigkill_resume_is_bitwise(tmp_path, es_reference):
  workdir = str(tmp_path)
  proc = _start_and_signal(
    workdir, signal.SIGKILL, "--config.method=es", "--config.es.num_steps=4", after_step=2
  )
  assert proc.wait() == -signal.SIGKILL
  killed_at, restored = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert 2 <= killed_at < 4  # the kill landed before the run ended: the resume has steps to run
  _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  step, params = checkpoint_params(os.path.join(workdir, "checkpoints"))
  ref_step, ref, _ = es_reference
  assert step == ref_step == 4
  for k in ref:
    np.testing.assert_array_equal(params[k], ref[k], err_msg=k)
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2, 3, 4]  # no line lost or repeated by the kill
  assert_resumed_steps_trained(rows, killed_at, restored, params)


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
  _, restored = checkpoint_params(os.path.join(workdir, "checkpoints"), step=3)
  out = _run(workdir, "--config.method=es", "--config.es.num_steps=4")
  assert "CorruptCheckpointWarning" in out.stderr and "checkpoints/4" in out.stderr
  step, params = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert step == 4
  for k in es_reference[1]:
    np.testing.assert_array_equal(params[k], es_reference[1][k], err_msg=k)
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2, 3, 4]  # step 4 rewritten, not appended
  assert_resumed_steps_trained(rows, 3, restored, params)  # step 4 rerun from checkpoint 3


def test_grpo_sigkill_resume_matches(tmp_path):
  overrides = ("--config.method=grpo", "--config.grpo.num_steps=2")
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "killed")
  _run(ref_dir, *overrides)
  proc = _start_and_signal(workdir, signal.SIGKILL, *overrides, after_step=1)
  assert proc.wait() == -signal.SIGKILL
  killed_at, restored = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert killed_at == 1  # the kill landed before step 2 was saved: the resume reruns it
  _run(workdir, *overrides)
  _, ref = checkpoint_params(os.path.join(ref_dir, "checkpoints"))
  step, params = checkpoint_params(os.path.join(workdir, "checkpoints"))
  assert step == 2
  assert_trained(ref_dir, ref)
  for k in ref:
    np.testing.assert_array_equal(params[k], ref[k], err_msg=k)
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2]  # no line lost or repeated by the kill
  assert_resumed_steps_trained(rows, killed_at, restored, params)


def test_resume_with_another_config_is_refused_but_budget_may_grow(tmp_path):
  config = _config(demo_config, method="es", eval__every=0, eval__final=False, export_hf=False)
  es_runner.run(config, str(tmp_path))
  other = _config(
    demo_config, method="es", eval__every=0, eval__final=False, export_hf=False, seed=1
  )
  with pytest.raises(ValueError, match="config.seed=1"):
    es_runner.run(other, str(tmp_path))
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
    es_runner.run(sigma, str(tmp_path))
  longer = _config(
    demo_config, method="es", eval__every=0, eval__final=False, export_hf=False, es__num_steps=4
  )  # a larger budget continues the run
  es_runner.run(longer, str(tmp_path))
  assert Checkpointer(str(tmp_path / "checkpoints"), async_save=False).latest_step() == 4


# The CLI's exit path is the same for every method; GRPO's own message for a huge learning rate
# is checked in process (finite_test.py::test_update_ratio_is_logged_and_a_huge_one_stops_the_run).
@pytest.mark.parametrize(
  "overrides, words",
  [
    (("--config.method=es", "--config.es.learning_rate=1e30"), "lower es.learning_rate"),
    (("--config.method=report",), "config.report.workdirs is empty"),
  ],
)
def test_a_run_that_cannot_learn_ends_non_zero_in_one_line(tmp_path, overrides, words):
  run = _Proc(str(tmp_path), *overrides)
  assert run.wait() == 2, run.stderr[-3000:]
  errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
  assert len(errors) == 1 and words in errors[0], run.stderr[-3000:]
  assert "Traceback" not in run.stderr
  assert not os.path.exists(os.path.join(tmp_path, "DONE"))
