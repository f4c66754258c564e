"""The code sandbox and the verifier against hostile programs and answers: each escape BLOCKED.

These run as root on Linux with `unshare` (as CI does); where the machine cannot isolate
programs, `test_isolation_is_available` fails loudly rather than skipping.
"""

import ast
import os
import re
import socket
import tempfile
import time

import pytest

from es_jax.rewards import code, verifier

SLACK_S = 5.0


def _run(program, tests="", setup="", **limits):
  limits.setdefault("timeout_s", 3.0)
  return code.run_sandboxed(program, tests, setup=setup, limits=code.Limits(**limits))


def test_isolation_is_available():
  mode, why = code.isolation_mode()
  assert mode in ("root", "userns"), f"this machine should isolate programs: {why}"


def test_correct_solution_passes_wrong_one_fails():
  tests = "assert add(1, 2) == 3\nassert math.isclose(half(1), 0.5)\nassert set(odd(5)) == {1, 3}"
  good = "def add(a, b):\n  return a + b\ndef half(x):\n  return x / 2\n"
  good += "def odd(n):\n  return (i for i in range(n) if i % 2)\n"
  result = _run(good, tests, setup="import math")
  assert result.passed, result
  assert not _run(good.replace("a + b", "a - b"), tests, setup="import math").passed


def test_network_blocked():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.2)
  port = server.getsockname()[1]
  program = (  # undo the import speed bump, then connect to the host's loopback listener
    "import sys\nfor m in ('socket', '_socket', 'select', 'selectors'):\n  sys.modules.pop(m)\n"
    f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), 1).sendall(b'hi')\n"
    "  print('CONNECTED')\nexcept OSError as e:\n  print('BLOCKED', e)\n"
  )
  result = _run(program, "")
  assert "BLOCKED" in result.output and "CONNECTED" not in result.output, result
  with pytest.raises(TimeoutError):  # nothing ever connected
    server.accept()
  server.close()


def _sandbox_processes(marker: bytes = b""):
  """Host pids of sandbox judges and their forks whose command line holds `marker` (another test
  worker may be running sandboxes of its own at the same time)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        line = f.read()
        if b"_sandbox_judge.py" in line and marker in line:
          found.append(pid)
    except OSError:
      pass
  return found


def test_forked_setsid_child_cannot_outlive_the_deadline():
  program = (
    "import os, time\nposix = os.getpid.__self__\nprint('pid', posix.getpid(), flush=True)\n"
    "try:\n  child = posix.fork()\nexcept OSError as e:\n"
    "  print('FORK BLOCKED', e, flush=True)\n  child = 1\n"
    "if child == 0:\n  posix.setsid()\n  time.sleep(30)\nwhile True:\n  pass\n"
  )
  # This run's own deadline, which its judge's command line (and every fork of it) carries: the
  # processes left afterwards are looked up by it, not confused with another worker's sandboxes.
  timeout_s = 1.0 + (os.getpid() % 997 + 1) * 1e-6
  start = time.monotonic()
  result = _run(program, "", timeout_s=timeout_s)
  assert result.status == "timeout" and time.monotonic() - start < 1.0 + SLACK_S
  assert "FORK BLOCKED" in result.output, result  # no fork as uid 65534 with RLIMIT_NPROC 0
  assert "pid 2" in result.output, result  # PID namespace: the judge is 1; all die with it
  time.sleep(0.2)
  assert _sandbox_processes(repr(timeout_s).encode()) == []


def test_writes_stay_in_a_bounded_private_tmp():
  host_tmp = tempfile.gettempdir()
  marker = f"es_jax_escape_{os.getpid()}"
  before = set(os.listdir(host_tmp))
  program = (
    f"import os\nfor path in ('/tmp/../{marker}', '/{marker}', {host_tmp + '/' + marker!r},\n"
    f"             {os.path.abspath(__file__) + '.x'!r}, '/usr/{marker}'):\n"
    "  try:\n    open(path, 'w').write('x')\n    print('WROTE', path)\n"
    "  except OSError as e:\n    print('WRITE BLOCKED', path, e.strerror)\n"
    "n = 0\ntry:\n  for n in range(200):\n    open(f'/tmp/f{n}', 'w').close()\n"
    "except OSError as e:\n  print('FILES STOPPED AT', n, e.strerror)\n"
  )
  result = _run(program, "", max_files=50)
  assert "FILES STOPPED AT" in result.output, result
  stopped = int(result.output.split("FILES STOPPED AT ")[1].split()[0])
  assert stopped <= 50, result.output
  assert not os.path.exists(os.path.abspath(__file__) + ".x")
  # Everything the program could write was its private /tmp (gone with its namespace), and
  # the sandbox left nothing in the host's temporary directory: neither the program's file nor
  # a sandbox work directory (other test workers share this directory, so only those names count).
  new = set(os.listdir(host_tmp)) - before
  escaped = re.compile(rf"{marker}|es_jax_sandbox_.*|f[0-9]+")
  ours = {n for n in new if escaped.fullmatch(n)}
  assert ours == set(), result.output
  assert all(p in result.output for p in ("WRITE BLOCKED /usr", "WRITE BLOCKED /" + marker))


def test_pass_cannot_be_forged():
  tests = "assert add(1, 2) == 3\nassert False"
  for program in (
    # print any 32-character string in memory (a harness's pass token), exit 0 before the tests fail
    "import __main__, sys, os, gc\nfor o in gc.get_objects():\n"
    "  if isinstance(o, str) and len(o) == 32:\n    sys.stdout.write('\\n' + o + '\\n')\n"
    "sys.stdout.flush()\nos._exit(0)\n",
    "import sys\nsys.exit(0)\n",
    "def add(a, b):\n  return 3\nimport builtins\nbuiltins.AssertionError = type('X', (), {})\n",
  ):
    result = _run(program, tests)
    assert not result.passed and result.status == "failed", (program, result)
  always_equal = (
    "class E:\n  def __eq__(self, other):\n    return True\ndef add(a, b):\n  return E()\n"
  )
  assert not _run(always_equal, "assert add(1, 2) == 3").passed
  reads_tests = (
    "import gc\nprint([o for o in gc.get_objects() if isinstance(o, str) and 'add(1' in o])"
  )
  assert "assert" not in _run(reads_tests, tests).output  # the tests never reach the program


def test_program_cannot_kill_the_trainer_or_judge():
  program = (
    "import os\nposix = os.getpid.__self__\nfor pid in (posix.getppid(), 1, -1):\n"
    "  try:\n    posix.kill(pid, 9)\n  except OSError as e:\n    print('KILL BLOCKED', pid)\n"
    "def add(a, b):\n  return a + b\n"
  )
  result = _run(program, "assert add(1, 2) == 3")
  assert result.passed, result  # the judge survived to give its verdict; so did this process


def test_host_files_are_invisible():
  secret_dir = tempfile.mkdtemp(prefix="es_jax_secret_")
  secret = os.path.join(secret_dir, "id_rsa")
  with open(secret, "w") as f:
    f.write("SECRET-KEY-MATERIAL")
  try:
    paths = [secret, os.path.abspath(code.__file__), os.path.expanduser("~/.ssh"), "/etc/passwd"]
    program = (
      f"import os\nfor path in {paths!r}:\n"
      "  try:\n    print('READ', path, open(path).read()[:50] if os.path.isfile(path) "
      "else os.listdir(path))\n  except OSError as e:\n    print('READ BLOCKED', path)\n"
      "print('ROOT', sorted(os.listdir('/')))\n"
    )
    result = _run(program, "")
  finally:
    os.remove(secret)
    os.rmdir(secret_dir)
  assert "SECRET" not in result.output and "READ /" not in result.output, result.output
  assert result.output.count("READ BLOCKED") == len(paths), result.output
  listing = set(ast.literal_eval(result.output.split("ROOT ")[1]))
  allowed = {"bin", "dev", "lib", "lib32", "lib64", "libx32", "sbin", "tmp", "usr"}
  allowed |= {p.split("/")[1] for p in code._binds()}  # the interpreter's prefix, read-only
  assert listing <= allowed, listing


def test_refuses_without_isolation_unless_opted_in(monkeypatch):
  monkeypatch.setattr(code, "_PROBE", {"mode": None, "why": "no namespaces in this test"})
  monkeypatch.delenv("ES_JAX_ALLOW_UNSANDBOXED_CODE", raising=False)
  with pytest.raises(code.SandboxUnavailableError, match="ES_JAX_ALLOW_UNSANDBOXED_CODE=1"):
    code.run_sandboxed("def f():\n  return 1", "assert f() == 1")
  monkeypatch.setenv("ES_JAX_ALLOW_UNSANDBOXED_CODE", "1")
  with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
    assert code.run_sandboxed("def f():\n  return 1", "assert f() == 1").passed
  with pytest.warns(RuntimeWarning):
    assert not code.run_sandboxed("def f():\n  return 2", "assert f() == 1").passed


# ------------------------------------------------------------------------------- verifier worker

_EVAL_TASKS = ("spiral_matrix", "string_insertion", "binary_matrix", "n_queens")
_PARSE_TASKS = ("polynomial_multiplication", "countdown", "puzzle24", "simple_integration")


@pytest.mark.parametrize("task", _EVAL_TASKS + _PARSE_TASKS)
def test_scorers_never_run_the_answer(task):
  import reasoning_gym

  entry = reasoning_gym.create_dataset(task, size=1, seed=3)[0]
  marker = os.path.join(tempfile.gettempdir(), f"es_jax_pwned_{task}_{os.getpid()}")
  for answer in (
    f"__import__('os').system('touch {marker}')",
    f"(lambda: __import__('os').system('touch {marker}'))()",
    f"x.__class__.__base__ and open('{marker}', 'w')",
  ):
    assert verifier.reasoning_gym_score(task, answer, entry) < 0.1  # format credit at most
    assert not os.path.exists(marker), f"{task} ran the answer"
  if task in _EVAL_TASKS:  # the gold answer, and a literal list where scorers accept one
    assert verifier.reasoning_gym_score(task, entry["answer"], entry) == 1.0


def test_no_other_reasoning_gym_scorer_calls_eval():
  import ast
  import importlib
  import pkgutil

  import reasoning_gym

  from es_jax.rewards import _verifier_worker

  calling = set()
  for info in pkgutil.walk_packages(reasoning_gym.__path__, "reasoning_gym."):
    spec = importlib.util.find_spec(info.name)
    if not spec or not spec.origin or not spec.origin.endswith(".py"):
      continue
    with open(spec.origin, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef) and node.name == "score_answer":
        for inner in ast.walk(node):
          if isinstance(inner, ast.Call) and getattr(inner.func, "id", "") in ("eval", "exec"):
            calling.add(info.name)
  assert calling and calling <= set(_verifier_worker.EVAL_SCORER_MODULES), calling


def test_safe_parse_expr_keeps_arithmetic():
  from es_jax.rewards import _verifier_worker as worker

  worker._harden_sympy()
  import sympy

  x = sympy.Symbol("x")
  assert sympy.sympify("2*x**2 + 3*x - sqrt(4)") == 2 * x**2 + 3 * x - 2
  assert worker.safe_parse_expr("(1+2)**2") == 9
  for bad in ("__import__('os')", "x.__class__", "[1][0]", "lambda: 1", "'a'", "eval"):
    if bad == "eval":  # a name, but never the builtin: a plain symbol
      assert worker.safe_parse_expr(bad) == sympy.Symbol("eval")
      continue
    with pytest.raises((ValueError, TypeError, SyntaxError)):
      worker.safe_parse_expr(bad)
