"""MBPP code reward: run the generated program against the task's asserts in a sandboxed process.

Never runs model code in this process. Each program gets a fresh `python -I -S` interpreter
(isolated mode, standard library only) in its own process group, in a temporary working directory
that is deleted afterwards, with an empty environment except PATH/LANG/HOME/TMPDIR, and with:
  * a wall-clock deadline (`timeout_s`): on expiry the whole process group is SIGKILLed;
  * RLIMIT_CPU (CPU seconds), RLIMIT_AS (`memory_bytes`), RLIMIT_FSIZE (`max_file_bytes`, which
    also caps captured output, written to a file), RLIMIT_NOFILE, RLIMIT_CORE = 0, and
    RLIMIT_NPROC = 0 (no fork or thread creation for a non-root user; Linux ignores NPROC for
    root, so the preamble also removes os.fork/exec/spawn/system/kill and blocks subprocess);
  * no network as far as an unprivileged preamble can manage: `socket`, `_socket`, `ssl`,
    `select`, `ctypes`, `subprocess`, `multiprocessing`, `pty` and `posix` are made unimportable
    before user code runs (so are http/urllib clients, which need `socket`).
Limits are set by the trusted preamble in the child (not `preexec_fn`, which is unsafe in a
threaded parent such as a JAX process). Pass/fail is read from a per-run random token that the
preamble prints after the last assert, so `sys.exit(0)` or `os._exit(0)` in the program fails.

This is a resource sandbox, not a security boundary: the program runs as the calling user, and a
deliberately hostile program can undo the preamble (e.g. load an extension module by path) or
find the token by frame introspection. Use a container or VM for untrusted code at scale.

`run_sandboxed` is thread-safe; run several with a thread pool to use more cores.
"""

import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from es_jax.rewards import verifier

_HARNESS = r"""
import os, resource, sys
_token = sys.stdin.readline().strip().encode()
sys.stdin = open(os.devnull)
_cpu, _mem, _fsize = (int(v) for v in sys.argv[1:4])
_limits = ((resource.RLIMIT_CPU, (_cpu, _cpu + 1)), (resource.RLIMIT_AS, (_mem, _mem)),
           (resource.RLIMIT_FSIZE, (_fsize, _fsize)), (resource.RLIMIT_NOFILE, (64, 64)),
           (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_NPROC, (0, 0)))
for _limit, _value in _limits:
  try:
    resource.setrlimit(_limit, _value)
  except (ValueError, OSError):
    pass
_sources = []
for _name in ("setup.py", "solution.py", "tests.py"):
  with open(_name) as _f:
    _sources.append((_name, _f.read()))
for _name in ("socket", "_socket", "ssl", "_ssl", "select", "selectors", "ctypes", "_ctypes",
              "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty",
              "posix"):
  sys.modules[_name] = None
for _name in ("fork", "forkpty", "system", "popen", "kill", "killpg", "execv", "execve", "execl",
              "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp",
              "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn",
              "posix_spawnp", "setsid", "setpgid"):
  if hasattr(os, _name):
    delattr(os, _name)
_write, _exit = os.write, os._exit
_namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
  for _name, _source in _sources:
    exec(compile(_source, _name, "exec"), _namespace)
except BaseException as _e:
  _write(2, ("%s: %s\n" % (type(_e).__name__, str(_e)[:500])).encode("utf-8", "replace"))
  sys.stderr.flush()
  _exit(1)
sys.stdout.flush()
_write(1, b"\n" + _token + b"\n")
_exit(0)
"""

_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


class SandboxResult(NamedTuple):
  passed: bool
  status: str  # "passed" | "failed" | "timeout"
  returncode: int | None  # negative: killed by that signal (e.g. -24 SIGXCPU, -9 SIGKILL)
  output: str  # the program's stdout and stderr, at most `max_output_chars`, token removed
  elapsed_s: float


def run_sandboxed(
  program: str,
  tests: str = "",
  *,
  setup: str = "",
  timeout_s: float = 5.0,
  memory_bytes: int = 512 << 20,
  max_file_bytes: int = 1 << 20,
  max_output_chars: int = 2000,
) -> SandboxResult:
  """Run `setup`, then `program`, then `tests` in one namespace in a sandboxed interpreter.

  Args:
    program: Python source to test (untrusted).
    tests: assert statements, e.g. MBPP's test_list joined by newlines.
    setup: code run first (MBPP's test_setup_code / test_imports).
    timeout_s: wall-clock limit; CPU time is limited to ceil(timeout_s) seconds too.
    memory_bytes: address-space limit (RLIMIT_AS).
    max_file_bytes: largest file the program may write, output included (RLIMIT_FSIZE).
    max_output_chars: how much output to return.

  Returns:
    SandboxResult; `passed` only if every statement ran and the preamble printed its token.
  """
  if timeout_s <= 0:
    raise ValueError(f"run_sandboxed: timeout_s={timeout_s} must be positive.")
  token = secrets.token_hex(16)
  start = time.monotonic()
  with tempfile.TemporaryDirectory(prefix="es_jax_sandbox_") as workdir:
    for name, source in (("harness.py", _HARNESS), ("setup.py", setup)):
      with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
        f.write(source)
    for name, source in (("solution.py", program), ("tests.py", tests)):
      with open(os.path.join(workdir, name), "w", encoding="utf-8", errors="replace") as f:
        f.write(source)
    out_path = os.path.join(workdir, "output.txt")
    limits = [str(math.ceil(timeout_s)), str(int(memory_bytes)), str(int(max_file_bytes))]
    env = dict(_ENV, HOME=workdir, TMPDIR=workdir)
    with open(out_path, "wb") as out:
      proc = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.join(workdir, "harness.py"), *limits],
        cwd=workdir,
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        close_fds=True,
        start_new_session=True,
      )
    timed_out = False
    try:
      proc.stdin.write(token.encode() + b"\n")
      proc.stdin.close()
    except OSError:
      pass  # it already exited
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      verifier.count_failure("timeouts")
    finally:
      try:  # also reaps anything the program left behind in its process group
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
      proc.wait()
    with open(out_path, "rb") as f:
      raw = f.read(max_file_bytes + 1024)
  elapsed = time.monotonic() - start
  text = raw.decode("utf-8", "replace")
  passed = not timed_out and proc.returncode == 0 and text.endswith("\n" + token + "\n")
  if passed:
    text = text[: -len(token) - 2]
  status = "timeout" if timed_out else ("passed" if passed else "failed")
  return SandboxResult(passed, status, proc.returncode, text[:max_output_chars], elapsed)


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
  result = run_sandboxed(
    extract_code(completion), tests, setup=setup, timeout_s=timeout_s, memory_bytes=memory_bytes
  )
  return float(result.passed)


def code_correct(
  completion: str, example: dict, *, timeout_s: float = 5.0, memory_bytes: int = 512 << 20
) -> bool:
  """Whether every test passes."""
  return code_reward(completion, example, timeout_s=timeout_s, memory_bytes=memory_bytes) == 1.0
