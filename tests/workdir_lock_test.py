"""Tests for experiments.infra.workdir_lock: one run per workdir, stale locks taken over."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from experiments.infra.workdir_lock import (
  LOCK_FILE,
  StaleLockWarning,
  WorkdirLock,
  WorkdirLockedError,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def test_second_lock_refused_until_released(tmp_path):
  workdir = tmp_path / "run"  # created by acquire
  with WorkdirLock(workdir):
    owner = json.loads((workdir / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    with pytest.raises(WorkdirLockedError, match=f"pid {os.getpid()} on host"):
      WorkdirLock(workdir).acquire()
  assert not (workdir / LOCK_FILE).exists()
  with WorkdirLock(workdir):  # free again, no warning
    pass


def test_lock_held_by_another_process_then_stale_after_kill(tmp_path):
  code = (
    "import sys, time\n"
    "from experiments.infra.workdir_lock import WorkdirLock\n"
    "WorkdirLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.Popen(
    [sys.executable, "-c", code, str(tmp_path)],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert proc.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirLockedError, match=f"pid {proc.pid} on host"):
      WorkdirLock(tmp_path).acquire()
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  # The killed run left its lock file behind; the kernel released its flock.
  assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid
  with pytest.warns(StaleLockWarning, match=f"pid {proc.pid} .* is not running"):
    lock = WorkdirLock(tmp_path).acquire()
  assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
  lock.release()


def test_object_store_lock_checks_owner(tmp_path):
  lock_file = tmp_path / LOCK_FILE
  lock = WorkdirLock(tmp_path)
  lock.remote = True  # the check-and-write path used for gs://
  lock_file.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
  with pytest.raises(WorkdirLockedError, match="delete"):
    lock.acquire()
  lock_file.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
  with pytest.warns(StaleLockWarning, match="is not running"):
    lock.acquire()
  assert json.loads(lock_file.read_text())["pid"] == os.getpid()
  lock.release()
  assert not lock_file.exists()
  lock_file.write_text(json.dumps({"pid": 1, "host": "another-host"}))  # cannot be checked
  with pytest.raises(WorkdirLockedError, match="another-host"):
    lock.acquire()
