"""MBPP code reward: run the generated program against the task's asserts in a sandbox.

Never runs model code in this process. The sandbox model (details in `_sandbox_judge.py`):

  * Isolation (Linux, `unshare` from util-linux): each call starts a judge process as PID 1 of
    fresh network, PID, mount and IPC namespaces (plus a user namespace when not root). The
    program runs in a child of the judge, chrooted into a read-only view of /usr and the Python
    prefix with a private tmpfs /tmp (`max_tmp_bytes`, `max_files`), as uid/gid 65534 with no
    capabilities and no_new_privs. So: no network (the new namespace has only a down loopback),
    no other process to see or signal, no host file to read or write, and at the deadline every
    descendant dies with the PID namespace, `setsid` or not. Nothing is left on the host disk.
  * Resource limits (one `Limits` value): wall clock `timeout_s`, RLIMIT_CPU, RLIMIT_AS
    (`memory_bytes`), RLIMIT_FSIZE (`max_file_bytes`), RLIMIT_NOFILE, RLIMIT_CORE = 0,
    RLIMIT_NPROC = 0.
  * Verdict: the judge runs the tests itself and calls into the program only through proxies
    whose answers are plain data, so the program can neither see the expected values nor report
    a pass (no token to steal, `assert False` cannot pass, an always-equal object does not
    compare equal). Tests see the program's functions, classes and data globals; arguments
    travel by value (an in-place mutation of an argument is not seen by the tests).
  * Where namespaces cannot be created (not Linux, no `unshare`, not root and no unprivileged
    user namespaces), `run_sandboxed` raises SandboxUnavailableError instead of running the
    program, unless the caller opts in with `allow_unsandboxed=True` or the environment variable
    ES_JAX_ALLOW_UNSANDBOXED_CODE=1: then it runs as the calling user with the limits only.

`run_sandboxed` is thread-safe; run several with a thread pool to use more cores.
"""

import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import NamedTuple

from es_jax.rewards import _sandbox_wire as _wire
from es_jax.rewards import verifier

_JUDGE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_judge.py")
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_OPT_IN = "ES_JAX_ALLOW_UNSANDBOXED_CODE"
_STARTUP_GRACE_S = 5.0  # the caller's backstop beyond `timeout_s` (the judge enforces timeout_s)
MODES = ("root", "userns", "unsafe")


class SandboxUnavailableError(RuntimeError):
  """This machine cannot isolate generated programs, and unsandboxed runs were not allowed."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one `run_sandboxed` call may use, one value; ``timeout_s`` is checked on construction.

  Attributes:
    timeout_s: wall-clock limit; CPU time is limited to ceil(timeout_s) seconds too.
    memory_bytes: address-space limit (RLIMIT_AS).
    max_file_bytes: largest file the program may write (RLIMIT_FSIZE).
    max_tmp_bytes: size of the program's writable /tmp.
    max_files: files and directories the program may create in /tmp.
    max_output_chars: how much output to return.
  """

  timeout_s: float = 5.0
  memory_bytes: int = 512 << 20
  max_file_bytes: int = 1 << 20
  max_tmp_bytes: int = 16 << 20
  max_files: int = 64
  max_output_chars: int = 2000

  def __post_init__(self):
    if not self.timeout_s > 0:
      raise ValueError(f"Limits.timeout_s={self.timeout_s} must be positive.")

  def judge_config(self) -> dict:
    """The limits as the judge reads them (with the host paths it binds)."""
    return {
      "binds": _binds(),
      "limits": [math.ceil(self.timeout_s), int(self.memory_bytes), int(self.max_file_bytes)],
      "tmp_bytes": int(self.max_tmp_bytes),
      "tmp_files": int(self.max_files),
      "max_output": 4 * int(self.max_output_chars) + 1024,
    }


class SandboxResult(NamedTuple):
  passed: bool
  status: str  # "passed" | "failed" | "timeout"
  returncode: int | None  # of the program; negative: killed by that signal (-24 SIGXCPU)
  output: str  # the program's stdout and stderr, then why it failed, at most max_output_chars
  elapsed_s: float


def _binds() -> list[str]:
  """Host directories the program needs: the interpreter's prefix (and /usr, always bound)."""
  python = os.path.realpath(sys.executable)
  prefixes = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}
  return sorted(p for p in prefixes if p != "/" and not p.startswith("/usr/"))


def _launcher(mode: str, config: dict) -> list[str]:
  judge = [sys.executable, "-I", "-S", _JUDGE_PATH, _wire.dumps(config, _wire.no_handle)]
  if mode == "unsafe":
    return judge
  unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin") or "unshare"
  user = ["--user", "--map-root-user"] if mode == "userns" else []
  return [
    unshare,
    "--net",
    "--pid",
    "--mount",
    "--ipc",
    "--fork",
    "--kill-child",
    *user,
    "--",
    *judge,
  ]


def _run(mode: str, config: dict, request: dict, timeout_s: float) -> tuple[str, int | None, str]:
  """(status, program returncode, output) of one judged run in `mode`."""
  workdir = tempfile.mkdtemp(prefix="es_jax_sandbox_") if mode == "unsafe" else None
  config = dict(config, mode=mode, workdir=workdir, timeout=float(timeout_s))
  command = _launcher(mode, config)
  try:
    proc = subprocess.Popen(
      command,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=_ENV,
      cwd="/",
      close_fds=True,
      start_new_session=True,  # unshare and the judge: one process group, killed as a whole
    )
  except OSError as e:
    if workdir:
      shutil.rmtree(workdir, ignore_errors=True)
    return "failed", None, f"sandbox: cannot start {command[0]}: {e}"
  try:
    payload = _wire.dumps(request, _wire.no_handle).encode("utf-8", "surrogatepass")
    out, err = proc.communicate(payload, timeout_s + _STARTUP_GRACE_S)
  except subprocess.TimeoutExpired:
    out, err = b"", b"sandbox: the judge missed its deadline"
  finally:
    try:  # unshare --kill-child takes the judge, and the PID namespace everything in it
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    proc.wait()
    if workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  try:
    verdict = _wire.loads(out.decode("utf-8", "surrogatepass"))
    return verdict["status"], verdict["returncode"], verdict["output"]
  except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError):
    status = "timeout" if err.startswith(b"sandbox: the judge missed") else "failed"
    return status, None, "sandbox: no verdict: " + err.decode("utf-8", "replace")[-2000:]


_PROBE: dict[str, object] = {}
_PROBE_LOCK = threading.Lock()


def isolation_mode() -> tuple[str | None, str]:
  """("root" | "userns", "") when this machine isolates programs, else (None, why not).

  Checked once per process by judging a trivial program in the isolated mode this user gets.
  """
  with _PROBE_LOCK:
    if "mode" not in _PROBE:
      mode, why = None, ""
      if not sys.platform.startswith("linux"):
        why = f"namespaces need Linux (this is {sys.platform})"
      elif not shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin"):
        why = "the `unshare` command (util-linux) is not installed"
      else:
        candidate = "root" if os.geteuid() == 0 else "userns"
        config = Limits(5, 256 << 20).judge_config()
        probe = {"program": "def f():\n  return 1", "tests": "assert f() == 1", "setup": ""}
        status, _, output = _run(candidate, config, probe, 10.0)
        if status == "passed":
          mode = candidate
        else:
          why = f"`unshare` could not build the sandbox as {candidate}: {output.strip()[-500:]}"
      _PROBE["mode"], _PROBE["why"] = mode, why
    return _PROBE["mode"], _PROBE["why"]


def _resolve_mode(allow_unsandboxed: bool | None) -> str:
  mode, why = isolation_mode()
  if mode is not None:
    return mode
  if allow_unsandboxed is None:
    allow_unsandboxed = os.environ.get(_OPT_IN, "") not in ("", "0")
  if not allow_unsandboxed:
    raise SandboxUnavailableError(
      f"code sandbox: cannot isolate generated programs on this machine ({why}). Running them "
      "needs Linux with `unshare` and root or unprivileged user namespaces. To run them anyway, "
      f"with resource limits only (no network, file or process isolation), set {_OPT_IN}=1 or "
      "pass allow_unsandboxed=True."
    )
  warnings.warn(
    f"code sandbox: running generated programs WITHOUT isolation ({why}).",
    RuntimeWarning,
    stacklevel=3,
  )
  return "unsafe"


def run_sandboxed(
  program: str,
  tests: str = "",
  *,
  setup: str = "",
  limits: Limits = Limits(),
  allow_unsandboxed: bool | None = None,
) -> SandboxResult:
  """Run `setup` then `program` in the sandbox, and judge `tests` against it.

  Args:
    program: Python source to test (untrusted).
    tests: Python statements (asserts) run by the judge, e.g. MBPP's test_list joined by
      newlines; they use the program's names.
    setup: code run first, in both the program and the judge (MBPP's test_setup_code /
      test_imports).
    limits: time, memory, file and output limits (`Limits`).
    allow_unsandboxed: run without isolation where it is unavailable (None: the environment
      variable ES_JAX_ALLOW_UNSANDBOXED_CODE decides).

  Returns:
    SandboxResult; `passed` only if the judge ran every test statement without an error.

  Raises:
    SandboxUnavailableError: no isolation here and unsandboxed runs not allowed.
  """
  mode = _resolve_mode(allow_unsandboxed)
  request = {"program": str(program), "tests": str(tests), "setup": str(setup)}
  start = time.monotonic()
  status, returncode, output = _run(mode, limits.judge_config(), request, float(limits.timeout_s))
  elapsed = time.monotonic() - start
  if status == "timeout":
    verifier.count_failure("timeouts")
  output = output[: limits.max_output_chars]
  return SandboxResult(status == "passed", status, returncode, output, elapsed)


def extract_code(completion: str) -> str:
  """The program in a completion: its ```python blocks joined (untagged ``` blocks when there
  are none; an unclosed last fence runs to the end), or the whole text when there are no fences.

  Untagged blocks are skipped when tagged ones exist because models often show example output
  in them.
  """
  parts = completion.split("```")
  if len(parts) == 1:
    return completion
  tagged, untagged = [], []
  for part in parts[1::2]:  # inside fences (the last one may be unclosed)
    first_line, _, body = part.partition("\n")
    language = first_line.strip().lower()
    if language in ("python", "py", "python3"):
      tagged.append(body)
    elif not language:
      untagged.append(body)
  return "\n".join(tagged or untagged)


def _tests_of(example: dict) -> tuple[str, str]:
  tests = example.get("test_list")
  if not tests or not all(isinstance(t, str) for t in tests):
    raise ValueError(
      f"code reward: example['test_list']={tests!r} must be a non-empty list of assert strings."
    )
  setup = [example.get("test_setup_code") or "", *(example.get("test_imports") or [])]
  return "\n".join(tests), "\n".join(s for s in setup if s)


def code_reward(
  completion: str, example: dict, *, timeout_s: float = 5.0, memory_bytes: int = 512 << 20
) -> float:
  """1.0 if the extracted program passes every assert of `example["test_list"]`, else 0.0."""
  tests, setup = _tests_of(example)
  limits = Limits(timeout_s=timeout_s, memory_bytes=memory_bytes)
  result = run_sandboxed(extract_code(completion), tests, setup=setup, limits=limits)
  return float(result.passed)


def code_correct(
  completion: str, example: dict, *, timeout_s: float = 5.0, memory_bytes: int = 512 << 20
) -> bool:
  """Whether every test passes."""
  return code_reward(completion, example, timeout_s=timeout_s, memory_bytes=memory_bytes) == 1.0
