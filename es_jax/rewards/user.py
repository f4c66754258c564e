"""A user's reward ("module:function" or "path/to/file.py:function") held to a contract.

The contract, enforced on every call:
  * The function is called as `fn(completion: str, example: dict)` and gets its own copy of the
    example: changing it (`example.clear()`) changes nothing the run uses later.
  * It returns a real number (bool, int, float, or a NumPy scalar of those) that is finite. A
    string such as "1.0", None, NaN, inf or a list is refused.
  * It answers within `timeout_s` seconds (importing the module has the same limit).
Anything else (a refused value, an exception, `SystemExit`, `KeyboardInterrupt`, the process
ending, a missed deadline) raises `RewardError`, one line naming the reward, the example (its
"id", else its prompt), the completion's first characters and what happened.

How: the function is imported and called in a worker process (`_user_worker.py`, the interpreter
of this process with its `sys.path` and working directory), so no code of the user's can end
this process, leave it stuck or touch its data: `os._exit(0)` in the reward ends only the
worker, and the call raises. This isolates failures, not privileges: the worker runs as the
calling user. A call costs one round trip through a pipe (pickled completion and example).
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from es_jax.rewards.verifier import kill_worker

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_user_worker.py")
_HEADER = struct.Struct("<I")
DEFAULT_TIMEOUT_S = 60.0
_CONTRACT = "a reward returns a finite real number (float, int or bool)"


class RewardError(ValueError):
  """A user's reward broke its contract (module docstring), in one line.

  Attributes:
    traceback: the user's traceback from the worker ("" when there is none).
    timed_out: the reward missed its deadline.
  """

  def __init__(self, message: str, *, traceback: str = "", timed_out: bool = False):
    super().__init__(" ".join(message.split()))
    self.traceback = traceback
    self.timed_out = timed_out


def is_user_reward(name: str) -> bool:
  """Whether `name` names a user's callable ("module:function" or "file.py:function")."""
  return isinstance(name, str) and ":" in name and not name.startswith("reasoning_gym/")


def _short(text: Any, size: int = 40) -> str:
  text = str(text)
  return repr(text[:size] + "…" if len(text) > size else text)


def describe_example(example: Mapping[str, Any] | Any) -> str:
  """The example as an error names it: its id, else the start of its prompt."""
  if isinstance(example, Mapping):
    if example.get("id") not in (None, ""):
      return f"example {str(example['id'])!r}"
    if "prompt" in example:
      return f"example with prompt {_short(example['prompt'])}"
  return f"example {_short(example)}"


def _wait_readable(fd: int, deadline: float) -> bool:
  """Whether `fd` has data (or hung up) before `deadline` (poll: fds >= 1024 are fine)."""
  remaining = deadline - time.monotonic()
  if remaining <= 0:
    return False
  poller = select.poll()
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(remaining * 1000))


class UserReward:
  """`reward(completion, example) -> float` calling the user's function in a worker process.

  Args:
    name: "module:function" or "path/to/file.py:function" (a relative path is taken from the
      working directory at construction).
    timeout_s: the limit for importing the module and for each call, in seconds.

  Raises (construction, when the worker imports the function, and every call):
    RewardError: the module cannot be imported, lacks the function, or the function broke the
      contract (module docstring).
  """

  def __init__(self, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S):
    module_name, _, attr = name.rpartition(":")
    if not module_name or not attr.isidentifier():
      raise RewardError(f"reward {name!r}: use 'module:function' or 'path/to/file.py:function'.")
    if module_name.endswith(".py"):
      if not os.path.isfile(module_name):
        raise RewardError(f"reward {name!r}: no such file {module_name!r}.")
      module_name = os.path.abspath(module_name)
    if not timeout_s > 0:
      raise ValueError(f"UserReward: timeout_s must be > 0 s, got {timeout_s!r}.")
    self.name, self.timeout_s = name, float(timeout_s)
    self._module, self._attr = module_name, attr
    self._cwd, self._path = os.getcwd(), [os.path.abspath(p or ".") for p in sys.path]
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None
    self._owner_pid = os.getpid()
    with self._lock:
      self._start()

  def __repr__(self) -> str:
    return f"UserReward({self.name!r}, timeout_s={self.timeout_s})"

  def __call__(self, completion: str, example: Mapping[str, Any]) -> float:
    """The reward of `completion` for `example` (a finite float), or RewardError."""

    def where() -> str:  # built on failure only: a call should cost a round trip, no more
      return (
        f"reward {self.name!r} on {describe_example(example)} (completion {_short(completion)})"
      )

    with self._lock:
      if self._proc is None or self._owner_pid != os.getpid():
        self._start()
      try:
        request = ("call", str(completion), example)
        reply = self._request(request, where)
      except (pickle.PicklingError, TypeError, AttributeError) as e:  # what pickle raises
        raise RewardError(f"{where()}: the example cannot be sent to the reward ({e}).") from None
    kind = reply[0]
    if kind == "value":
      return reply[1]
    if kind == "bad":
      raise RewardError(f"{where()}: returned {reply[1]} ({reply[2]}); {_CONTRACT}.")
    raise RewardError(f"{where()}: raised {reply[1]}.", traceback=reply[2])

  def close(self) -> None:
    """Stops the worker (the next call starts another)."""
    with self._lock:
      self._kill()

  def _start(self) -> None:
    if self._owner_pid != os.getpid():  # forked: the parent's worker is not ours to use
      self._proc, self._owner_pid = None, os.getpid()
    self._kill()
    self._proc = subprocess.Popen(
      [sys.executable, "-I", _WORKER_PATH],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      cwd=self._cwd,
      close_fds=True,
      start_new_session=True,  # its own process group: a kill takes the user's children too
    )
    where = f"reward {self.name!r} while importing {self._module}"
    reply = self._request(("load", self._module, self._attr, self._path), lambda: where)
    if reply[0] != "ready":
      self._kill()
      raise RewardError(f"reward {self.name!r}: {reply[1]}.", traceback=reply[2])

  def _kill(self) -> None:
    proc, self._proc = self._proc, None
    kill_worker(proc)

  def _request(self, request: tuple, where: Callable[[], str]) -> tuple:
    """Sends `request`, returns the reply; RewardError (worker killed) when none comes in time."""
    payload = pickle.dumps(request)
    deadline = time.monotonic() + self.timeout_s
    proc = self._proc
    try:
      proc.stdin.write(_HEADER.pack(len(payload)) + payload)
      proc.stdin.flush()
      return pickle.loads(self._read(proc.stdout.fileno(), deadline))
    except TimeoutError:
      self._kill()
      raise RewardError(
        f"{where()}: no answer within the time limit of {self.timeout_s:g} s (worker stopped).",
        timed_out=True,
      ) from None
    except (OSError, EOFError):
      self._kill()
      raise RewardError(
        f"{where()}: its process ended with exit status {proc.returncode} instead of answering; "
        "a reward must return a number, not exit."
      ) from None

  @staticmethod
  def _read(fd: int, deadline: float) -> bytes:
    buffer = b""
    size = None
    while size is None or len(buffer) < _HEADER.size + size:
      if not _wait_readable(fd, deadline):
        raise TimeoutError
      chunk = os.read(fd, 1 << 16)
      if not chunk:
        raise EOFError
      buffer += chunk
      if size is None and len(buffer) >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer)
    return buffer[_HEADER.size : _HEADER.size + size]


@functools.cache
def _cached(key: tuple, name: str, timeout_s: float) -> UserReward:
  del key  # the cache key: the name, its file's absolute path and the time limit
  reward = UserReward(name, timeout_s=timeout_s)
  atexit.register(reward.close)
  return reward


def user_reward(name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> UserReward:
  """The `UserReward` "module:function" or "path/to/file.py:function" names, one worker per
  name (a file by its absolute path) and time limit in this process.

  Raises:
    RewardError: the module or file cannot be imported, has no such function, or the function
      does not take (completion, example).
  """
  module_name = name.rpartition(":")[0]
  where = os.path.abspath(module_name) if module_name.endswith(".py") else os.getcwd()
  return _cached((name, where, float(timeout_s)), name, float(timeout_s))
