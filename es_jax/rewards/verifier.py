"""Run symbolic checks (math-verify, reasoning-gym scorers) in a killable worker process.

Why a process and not math-verify's own timeouts: those use `signal.alarm`, which only works in
the main thread, has one-second granularity, and cannot free memory that a runaway computation
(`10^{10^{10}}`, `9**9**9`) has already taken. Some reasoning-gym scorers also `eval` or
`sympy.parse_expr` the model's answer. The worker is one long-lived `python -I` process with an
address-space limit (RLIMIT_AS); each request gets a wall-clock deadline, and a worker that misses
it is killed (its whole process group) and restarted on the next call. Inside the worker,
math-verify's signal timeouts are still used (it is the worker's main thread), so most slow
checks end without a restart.

Guarantees and limits, stated plainly:
  * A call returns within `timeout_s` once the worker is up. The first call of each kind (math,
    reasoning-gym) in a fresh worker also waits for imports, bounded by `startup_timeout_s`
    (about 1-3 s here); so does the first call after a kill.
  * Calls from several threads are serialised by a lock (one worker per process).
  * This is isolation for time and memory, not a security boundary: the worker runs as the
    calling user. Model output is only ever passed as data to math-verify or to a reasoning-gym
    scorer. The worker rebinds `eval` in the reasoning-gym scorers that eval answers to
    `ast.literal_eval`, and sympy's `parse_expr` (hence `sympify` of strings) to a parser that
    accepts only arithmetic tokens and evaluates with no builtins (`_verifier_worker.py`).
    Code execution lives in `es_jax.rewards.code`.
"""

import atexit
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time

_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verifier_worker.py")
# Environment for the worker: no inherited secrets or PYTHON* settings (-I drops those too).
_WORKER_ENV = {
  "PATH": "/usr/bin:/bin",
  "LANG": "C.UTF-8",
  "OMP_NUM_THREADS": "1",
  "OPENBLAS_NUM_THREADS": "1",
  "MKL_NUM_THREADS": "1",
}
_OP_MODULE = {"math_equal": "math_verify", "rg_score": "reasoning_gym"}


def _wait(fd: int, event: int, deadline: float) -> bool:
  """Whether `fd` becomes ready for `event` (or hangs up) before `deadline`.

  poll, not select: select fails on descriptors >= 1024, common in a large training process.
  """
  remaining = deadline - time.monotonic()
  if remaining <= 0:
    return False
  poller = select.poll()
  poller.register(fd, event)
  return bool(poller.poll(remaining * 1000))


def kill_worker(proc: subprocess.Popen | None) -> None:
  """Kills a worker started with start_new_session=True (its whole process group), reaps it and
  closes its pipes; None does nothing."""
  if proc is None:
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()
  for stream in (proc.stdin, proc.stdout):
    try:
      stream.close()
    except OSError:
      pass


class VerifierError(RuntimeError):
  """A check failed, timed out or crashed the worker; callers score the answer as incorrect."""


class VerifierTimeout(VerifierError):
  """A check missed its deadline; the worker was killed."""


# Checks scored 0 because they failed, per kind, since the process started (all threads).
_FAILURES = {"timeouts": 0, "errors": 0}
_FAILURES_LOCK = threading.Lock()


def count_failure(kind: str) -> None:
  """Counts one reward check scored 0 for `kind` ("timeouts" or "errors")."""
  with _FAILURES_LOCK:
    _FAILURES[kind] += 1


def failure_counts() -> dict[str, int]:
  """{"timeouts", "errors"}: reward checks (verifier and code sandbox) scored 0 so far because
  they missed their deadline or crashed, counted in this process since it started."""
  with _FAILURES_LOCK:
    return dict(_FAILURES)


def _count(error: VerifierError) -> None:
  count_failure("timeouts" if isinstance(error, VerifierTimeout) else "errors")


class VerifierProcess:
  """A restartable worker process; see the module docstring.

  Args:
    memory_bytes: address-space limit of the worker (RLIMIT_AS).
    startup_timeout_s: limit for starting the worker and importing a checker library.
  """

  def __init__(self, *, memory_bytes: int = 4 << 30, startup_timeout_s: float = 120.0):
    self.memory_bytes = int(memory_bytes)
    self.startup_timeout_s = float(startup_timeout_s)
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None
    self._owner_pid = os.getpid()
    self._warm: set[str] = set()
    self._buffer = b""
    self.restarts = 0  # workers killed after a missed deadline or a crash

  def call(self, op: str, *, timeout_s: float, **args):
    """Run `op` with keyword `args` in the worker; returns its value or raises VerifierError."""
    if op not in _OP_MODULE:
      raise ValueError(f"VerifierProcess.call: unknown op {op!r}; known: {sorted(_OP_MODULE)}.")
    with self._lock:
      if self._proc is None or self._owner_pid != os.getpid() or self._proc.poll() is not None:
        self._start()
      module = _OP_MODULE[op]
      if module not in self._warm:
        self._request("warm", {"module": module}, self.startup_timeout_s)
        self._warm.add(module)
      return self._request(op, args, timeout_s)

  def close(self):
    """Kill the worker (it is restarted by the next call)."""
    with self._lock:
      self._kill()

  def _start(self):
    if self._owner_pid != os.getpid():  # forked: the parent's worker is not ours to use
      self._proc, self._owner_pid = None, os.getpid()
    self._kill()
    self._proc = subprocess.Popen(
      [sys.executable, "-I", _WORKER_PATH, str(self.memory_bytes)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=_WORKER_ENV,
      cwd="/",
      close_fds=True,
      start_new_session=True,  # own process group, killed as a whole
    )
    os.set_blocking(self._proc.stdin.fileno(), False)
    self._buffer, self._warm = b"", set()
    try:
      self._read_reply(time.monotonic() + self.startup_timeout_s)
    except (TimeoutError, OSError, VerifierError) as e:
      self._kill()
      raise VerifierError(
        f"verifier worker did not start within {self.startup_timeout_s} s ({type(e).__name__}); "
        "check that math-verify and reasoning-gym import in this environment."
      ) from e

  def _kill(self):
    proc, self._proc = self._proc, None
    kill_worker(proc)

  def _request(self, op, args, timeout_s):
    deadline = time.monotonic() + float(timeout_s)
    payload = pickle.dumps({"op": op, "args": args})
    data = memoryview(struct.pack("<I", len(payload)) + payload)
    try:
      fd = self._proc.stdin.fileno()
      while data:
        if not _wait(fd, select.POLLOUT, deadline):
          raise TimeoutError
        try:
          data = data[os.write(fd, data) :]
        except BlockingIOError:
          continue
      return self._read_reply(deadline)
    except _WorkerReportedError:
      raise  # the worker answered (with an error) and keeps serving
    except (TimeoutError, BrokenPipeError, ConnectionError, VerifierError, OSError) as e:
      self._kill()
      self.restarts += 1
      timed_out = isinstance(e, TimeoutError)
      what = "timed out" if timed_out else f"failed ({type(e).__name__})"
      raise (VerifierTimeout if timed_out else VerifierError)(
        f"verifier op {op!r} {what}; worker killed, restarts on next call."
      ) from e

  def _read_reply(self, deadline):
    fd = self._proc.stdout.fileno()
    while b"\n" not in self._buffer:
      if not _wait(fd, select.POLLIN, deadline):
        raise TimeoutError
      chunk = os.read(fd, 65536)
      if not chunk:
        raise VerifierError("verifier worker exited (crash or memory limit).")
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b"\n", 1)
    reply = json.loads(line)
    if not reply["ok"]:
      # The worker survived (it reports and keeps serving): no restart needed.
      raise _WorkerReportedError(reply["error"])
    return reply["value"]


class _WorkerReportedError(VerifierError):
  pass


_DEFAULT: VerifierProcess | None = None
_DEFAULT_LOCK = threading.Lock()


def default_verifier() -> VerifierProcess:
  """The process-wide worker used by the reward functions."""
  global _DEFAULT
  with _DEFAULT_LOCK:
    if _DEFAULT is None:
      _DEFAULT = VerifierProcess()
      atexit.register(_DEFAULT.close)
    return _DEFAULT


def math_equal(gold: str, pred: str, *, timeout_s: float = 5.0) -> bool:
  """math-verify equivalence of two LaTeX answers (each parsed as `$...$`), False on failure.

  math-verify's inner timeouts get a quarter of `timeout_s` each (at least 1 s, its
  granularity); the hard deadline `timeout_s` kills the worker if those do not fire.
  """
  try:
    return bool(
      default_verifier().call(
        "math_equal",
        gold=gold,
        pred=pred,
        inner_timeout=max(1, int(timeout_s / 4)),
        timeout_s=timeout_s,
      )
    )
  except VerifierError as e:
    _count(e)
    return False


def reasoning_gym_score(
  name: str, answer: str | None, entry: dict, *, timeout_s: float = 5.0
) -> float:
  """reasoning-gym's own `score_answer(answer, entry)` for dataset `name`; 0.0 when it fails.

  Raises:
    ValueError: `name` is not a registered reasoning-gym dataset.
  """
  try:
    score = default_verifier().call(
      "rg_score", name=name, answer=answer, entry=entry, timeout_s=timeout_s
    )
  except VerifierError as e:
    _count(e)
    return 0.0
  if score is None:
    raise ValueError(
      f"reasoning_gym_score: {name!r} is not a reasoning-gym dataset; use the entry's "
      "metadata['source_dataset'] (e.g. 'chain_sum')."
    )
  return float(score)
