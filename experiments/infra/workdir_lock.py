"""One run per workdir: a lock file, `<workdir>/run.lock`, held for the whole run.

Two runs on the same workdir would interleave metrics.jsonl and race on checkpoint saves, so the
second one is refused with `WorkdirLockedError` naming the owner (pid, host, start time).

Local workdirs are locked with `fcntl.flock` on the lock file: the kernel releases the lock when
its process dies, however it dies. A lock file left behind by a dead process (SIGKILL, a crash)
is therefore taken over, with a warning naming the old owner and whether its pid still runs on
this host. gs:// workdirs cannot be locked atomically: the lock file is checked and written (a
check, not a guarantee), and one left by a process that is not running on this host must be
deleted by hand (the error says so).

Several hosts (jax.distributed): process 0 alone takes the lock and tells the others whether it
got it, so every process raises, or none does.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from typing import Any

from etils import epath

LOCK_FILE = "run.lock"


class WorkdirLockedError(RuntimeError):
  """Another run holds the workdir's lock."""


class StaleLockWarning(UserWarning):
  """A lock file left by a run that is no longer running was taken over."""


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, another user's
    return True
  return True


def _owner() -> dict[str, Any]:
  return {
    "pid": os.getpid(),
    "host": socket.gethostname(),
    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  }


def _describe(owner: dict[str, Any] | None) -> str:
  if not owner:
    return "an unknown run (the lock file is empty or unreadable)"
  return f"pid {owner.get('pid')} on host {owner.get('host')}, started {owner.get('started')}"


def _parse(text: str) -> dict[str, Any] | None:
  try:
    owner = json.loads(text)
  except ValueError:
    return None
  return owner if isinstance(owner, dict) else None


class WorkdirLock:
  """The lock of one workdir; `acquire` / `release`, or use as a context manager.

  Example:
    with WorkdirLock(workdir):
      run(config, workdir)
  """

  def __init__(self, workdir: str | os.PathLike):
    self.workdir = os.fspath(workdir)
    self.remote = "://" in self.workdir
    self.path = (
      epath.Path(self.workdir) / LOCK_FILE
      if self.remote
      else epath.Path(os.path.abspath(self.workdir)) / LOCK_FILE
    )
    self._fd: int | None = None
    self._held = False

  def _refuse(self, owner: dict[str, Any] | None, extra: str = "") -> WorkdirLockedError:
    return WorkdirLockedError(
      f"{self.workdir} is in use by {_describe(owner)} (lock file {self.path}); wait for that run "
      f"to end, or use another --workdir.{extra}"
    )

  def _take_over_warning(self, old: dict[str, Any] | None) -> None:
    if not old:
      return
    here = old.get("host") == socket.gethostname()
    dead = here and isinstance(old.get("pid"), int) and not _pid_alive(old["pid"])
    why = "is not running" if dead else "no longer holds the lock"
    warnings.warn(
      f"{self.path}: took over a stale lock of {_describe(old)}, which {why}.",
      StaleLockWarning,
      stacklevel=3,
    )

  def _acquire_local(self) -> None:
    import fcntl

    os.makedirs(self.path.parent, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        owner = _parse(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        os.close(fd)
        raise self._refuse(owner) from None
      # The file may have been unlinked by its releasing owner between open and flock.
      try:
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    self._take_over_warning(_parse(os.pread(fd, 4096, 0).decode("utf-8", "replace")))
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_owner()) + "\n").encode(), 0)
    os.fsync(fd)
    self._fd = fd

  def _acquire_remote(self) -> None:
    if self.path.exists():
      old = _parse(self.path.read_text())
      here = bool(old) and old.get("host") == socket.gethostname()
      if not (here and isinstance(old.get("pid"), int) and not _pid_alive(old["pid"])):
        raise self._refuse(
          old, f" If no run uses it any more, delete {self.path} (object stores have no locks)."
        )
      self._take_over_warning(old)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.path.write_text(json.dumps(_owner()) + "\n")

  def acquire(self) -> WorkdirLock:
    """Takes the lock (process 0 of a multi-host job; the others learn the outcome).

    Raises:
      WorkdirLockedError: another live run holds it.
    """
    import jax

    error: WorkdirLockedError | None = None
    if jax.process_index() == 0:
      try:
        (self._acquire_remote if self.remote else self._acquire_local)()
        self._held = True
      except WorkdirLockedError as err:
        error = err
    if jax.process_count() > 1:
      import numpy as np
      from jax.experimental import multihost_utils

      ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
      if not int(ok) and error is None:
        error = WorkdirLockedError(f"process 0 could not lock {self.workdir}; see its log.")
    if error is not None:
      raise error
    return self

  def release(self) -> None:
    """Removes the lock file (if this process wrote it) and releases the lock."""
    if not self._held:
      return
    self._held = False
    with contextlib.suppress(OSError):
      if self.remote:
        if (_parse(self.path.read_text()) or {}).get("pid") == os.getpid():
          self.path.unlink()
      else:
        os.unlink(self.path)  # while still holding the flock: see the inode check in acquire
    if self._fd is not None:
      os.close(self._fd)  # releases the flock
      self._fd = None

  def __enter__(self) -> WorkdirLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
