"""Judge of the code sandbox (es_jax.rewards.code); never imported by es_jax.

Started by `run_sandboxed` as `python -I -S _sandbox_judge.py CONFIG`, normally by `unshare` as
PID 1 of fresh network, PID, mount and IPC namespaces (plus a user namespace when not root).
CONFIG (limits, mode, directories; nothing secret) is in the argument vector; the program, setup
and tests come on stdin, read only after the program process has been forked; the verdict goes
to stdout. All three use the codec of `_sandbox_wire.py`: plain data only, parsed by hand, so
nothing the program sends is ever evaluated. The confinement of steps 1-2 below (root,
privileges, rlimits, speed bumps) is `_sandbox_confine.py`. Both files are loaded by path from
this file's directory (`-I` leaves it off sys.path), before the program process is forked.

What it does (isolated modes, "root" and "userns"):
  1. Builds the program's root in a private tmpfs: read-only, nosuid bind mounts of /usr (and
     the /bin, /lib... links), the interpreter's prefix and /dev/null; a writable tmpfs /tmp with
     a byte and file-count bound. Nothing else of the host is visible (no /home, /root, project,
     /proc). Everything vanishes with the mount namespace.
  2. Forks the program process before reading stdin (so its copy of this process's memory holds
     no test): it enters that root (chroot), drops to uid/gid 65534 with no groups (as root; in
     "userns" mode inside a nested user namespace, so it holds no capability), sets
     no_new_privs and the rlimits, receives `setup` + `program`, runs them, then only answers
     requests (`serve`).
  3. Runs the tests itself, in this process, with the program's names bound to proxies: calling,
     indexing or iterating a proxy is a request to the program process, whose answer comes back
     as plain data (or another opaque proxy). Comparisons, `assert`, `math.isclose` etc. all run
     here, on data.

Why a pass cannot be forged: the verdict is this process's own result of running the tests, and
the program process cannot reach it. It never sees the tests or their expected values (only the
arguments of the calls the tests make), holds none of this process's file descriptors except its
own request/reply pipes, cannot signal this process (PID 1 of its namespace ignores signals from
inside, and as uid 65534 it may not signal root anyway), cannot ptrace or read its memory (other
uid, or no capability and this process is non-dumpable), and its answers are decoded as plain
data: an object whose `__eq__` always returns True stays in the program process, and its proxy
here compares by identity. Exiting early (`os._exit(0)`), printing anything, or raising
SystemExit leaves the tests unfinished, which is a failure.

Deadline: the program has `timeout` seconds from its start; a late reply is a timeout. When this
process exits, the kernel kills everything left in the PID namespace; `unshare --kill-child`
kills this process when the caller kills `unshare`.

"unsafe" mode (opt-in where namespaces are unavailable) skips steps 1-2's isolation: the program
runs as the caller in its own session in `workdir`, with the rlimits only.
"""

import builtins
import fcntl
import importlib
import importlib.util
import io
import os
import select
import signal
import sys
import time


def _load_beside(name: str):
  """`name`.py of this file's directory, loaded by path (nothing of es_jax is imported)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


wire = _load_beside("_sandbox_wire")
confine = _load_beside("_sandbox_confine")  # before the fork: nothing is imported after chroot
# Standard-library modules the program may import that the tests may use by the same name; these
# are imported here (trusted code). Modules with import-time side effects are left out.
_NO_IMPORT = {"antigravity", "this", "idlelib", "turtle", "turtledemo", "tkinter", "webbrowser"}

# -------------------------------------------------------------------------------- program side


def serve(limits: list[int]) -> None:
  """The program process, after it entered its root and dropped privileges (never returns).

  fd 0: requests from the judge (one at a time, so plain blocking reads), 1 and 2: output,
  3: replies. Runs setup + program, then answers requests with plain data or handles.
  """
  confine.set_limits(limits)
  sys.stdin = io.StringIO("")
  handles = []

  def handle(value):
    handles.append(value)
    return len(handles) - 1

  def reply(ok, value):
    try:
      text = wire.dumps({"ok": ok, "v": value}, handle)
    except BaseException as e:  # noqa: BLE001 - e.g. MemoryError, RecursionError
      text = wire.dumps({"ok": False, "v": f"{type(e).__name__} while encoding the result"}, None)
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except BaseException:  # noqa: BLE001
        pass
    wire.write_message(3, text)

  source = wire.loads(wire.read_message(0))
  confine.add_speed_bumps()
  try:
    reply(True, _run_program(source))
  except BaseException as e:  # noqa: BLE001 - the program's own failure, reported
    reply(False, _error(e))
    os._exit(1)
  while True:
    try:
      text = wire.read_message(0)
      if text is None:
        break
      reply(True, _answer(wire.loads(text, handles.__getitem__)))
    except BaseException as e:  # noqa: BLE001 - includes SystemExit from the program
      reply(False, _error(e))
  os._exit(0)


def _error(e: BaseException) -> str:
  return f"{type(e).__name__}: {str(e)[:500]}"


def _run_program(source: dict) -> dict:
  """Runs setup + program: {"names": the program's new names (value or handle), "modules": the
  modules it bound, by name}."""
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  absent = object()
  exec(compile(source["setup"], "setup.py", "exec"), namespace)
  before = dict(namespace)
  exec(compile(source["program"], "solution.py", "exec"), namespace)
  names, modules = {}, {}
  for name, value in list(namespace.items()):
    if name.startswith("__") or before.get(name, absent) is value:
      continue
    if type(value) is type(os):
      modules[name] = str(value.__name__)
    else:
      names[name] = value
  return {"names": names, "modules": modules}


def _answer(request: dict):
  """The value a request of the judge asks for: an operation on an object of the program."""
  op, target = request["op"], request.get("target")
  if op == "call":
    return target(*request["args"], **request["kwargs"])
  if op == "attr":
    return getattr(target, request["name"])
  if op == "iter":
    return list(target)
  if op == "getitem":
    return target[request["key"]]
  if op == "contains":
    return bool(request["key"] in target)
  if op == "len":
    return int(len(target))
  if op == "bool":
    return bool(target)
  value = str(target)  # "str"
  return str.__str__(value) if isinstance(value, str) else ""


def _high(fd: int) -> int:
  return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def start_program(config: dict) -> tuple[int, int, int, int]:
  """Forks the program process; returns (pid, request fd, output fd, reply fd)."""
  mode = config["mode"]
  req_r, req_w = os.pipe()
  out_r, out_w = os.pipe()
  rep_r, rep_w = os.pipe()
  child_fds = [_high(fd) for fd in (req_r, out_w, out_w, rep_w)]
  home = "/tmp" if mode != "unsafe" else config["workdir"]
  pid = os.fork()
  if pid == 0:
    try:
      for target, fd in enumerate(child_fds):
        os.dup2(fd, target)
      os.closerange(4, 1 << 16)  # the judge's stdin (the tests) and stdout (the verdict) too
      os.environ.clear()
      os.environ.update(PATH="/usr/bin:/bin", LANG="C.UTF-8", HOME=home, TMPDIR=home)
      if mode == "unsafe":
        os.setsid()
        os.chdir(home)
      else:
        confine.enter_root(mode)
      serve([int(v) for v in config["limits"]])
    except BaseException as e:  # noqa: BLE001
      os.write(2, f"sandbox: program process setup failed: {e}\n".encode())
    os._exit(127)
  for fd in (req_r, out_w, rep_w, *child_fds):
    os.close(fd)
  os.set_blocking(req_w, False)
  os.set_blocking(rep_r, False)
  return pid, req_w, out_r, rep_r


# ---------------------------------------------------------------------------------- judge side


class ProgramError(Exception):
  """The program raised while serving a request (the message is the program's error)."""


class _Stop(BaseException):
  """The program missed its deadline or exited: the tests cannot go on (tests cannot catch it)."""

  def __init__(self, status: str, detail: str):
    super().__init__(detail)
    self.status, self.detail = status, detail


class Program:
  """The program process, seen from the judge: requests and replies over pipes, each bounded by
  the deadline, with the program's output drained (and kept up to `max_output` bytes)."""

  def __init__(self, pid, req_w, out_r, rep_r, deadline, max_output):
    self.pid, self.req_w, self.out_r, self.rep_r = pid, req_w, out_r, rep_r
    self.deadline, self.max_output = deadline, max_output
    self.output = bytearray()
    self._buffer = b""
    self._output_open = True

  def _poll(self, fd, event) -> bool:
    remaining = self.deadline - time.monotonic()
    if remaining <= 0:
      raise _Stop("timeout", "the program missed its deadline")
    poller = select.poll()
    if self._output_open:
      poller.register(self.out_r, select.POLLIN)
    poller.register(fd, event)
    ready = False
    for fd_ready, _ in poller.poll(remaining * 1000):
      if fd_ready == self.out_r:
        self._drain()
      elif fd_ready == fd:
        ready = True
    return ready

  def _drain(self):
    try:
      chunk = os.read(self.out_r, 1 << 16)
    except BlockingIOError:
      raise
    except OSError:
      chunk = b""
    if not chunk:  # the program closed its output (it exited)
      self._output_open = False
    elif len(self.output) < self.max_output:
      self.output += chunk[: self.max_output - len(self.output)]

  def send(self, text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    data = memoryview(b"%d\n" % len(data) + data)
    while data:
      if self._poll(self.req_w, select.POLLOUT):
        try:
          data = data[os.write(self.req_w, data) :]
        except BlockingIOError:
          continue
        except BrokenPipeError:
          raise _Stop("failed", "the program exited before the tests finished") from None

  def _read_some(self):
    if self._poll(self.rep_r, select.POLLIN):
      try:
        chunk = os.read(self.rep_r, 1 << 20)
      except BlockingIOError:
        return
      if not chunk:
        raise _Stop("failed", "the program exited before the tests finished")
      self._buffer += chunk

  def receive(self):
    """The program's next reply: (ok, value), handles turned into proxies."""
    while b"\n" not in self._buffer:
      if len(self._buffer) > 32:
        raise _Stop("failed", "malformed reply from the program")
      self._read_some()
    size, _, rest = self._buffer.partition(b"\n")
    if not size.isdigit() or int(size) > wire.MAX_MESSAGE:
      raise _Stop("failed", "malformed or oversized reply from the program")
    size = int(size)
    self._buffer = rest
    while len(self._buffer) < size:
      self._read_some()
    data, self._buffer = self._buffer[:size], self._buffer[size:]
    try:
      reply = wire.loads(data.decode("utf-8", "surrogatepass"), lambda ref: Proxy(self, ref))
      return bool(reply["ok"] is True), reply["v"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, MemoryError) as e:
      raise _Stop("failed", f"malformed reply from the program ({type(e).__name__})") from None

  def request(self, **message):
    self.send(wire.dumps(message, _proxy_ref))
    ok, value = self.receive()
    if not ok:
      raise ProgramError(str(value))
    return value

  def finish(self) -> int | None:
    """Ends the program (end of requests, then SIGKILL); returns its exit status."""
    os.close(self.req_w)
    for _ in range(100):  # it exits at once on end of requests; do not wait for a busy one
      pid, status = os.waitpid(self.pid, os.WNOHANG)
      if pid or time.monotonic() > self.deadline:
        break
      time.sleep(0.001)
    if not pid:
      for kill in (os.killpg, os.kill):  # its session too in unsafe mode
        try:
          kill(self.pid, signal.SIGKILL)
        except OSError:
          pass
      _, status = os.waitpid(self.pid, 0)
    os.set_blocking(self.out_r, False)
    while self._output_open and len(self.output) < self.max_output:
      try:
        self._drain()
      except BlockingIOError:
        break
    return os.waitstatus_to_exitcode(status)


def _proxy_ref(value):
  if type(value) is Proxy:
    return object.__getattribute__(value, "_ref")
  return wire.no_handle(value)


class Proxy:
  """An object that lives in the program process. No `__eq__`/`__hash__` of its own: it compares
  by identity here, so a program object cannot claim to equal an expected value."""

  __slots__ = ("_program", "_ref")

  def __init__(self, program: Program, ref: int):
    object.__setattr__(self, "_program", program)
    object.__setattr__(self, "_ref", ref)

  def _do(self, op, **args):
    return self._program.request(op=op, target=self, **args)

  def __call__(self, *args, **kwargs):
    return self._do("call", args=list(args), kwargs=kwargs)

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return self._do("attr", name=name)

  def __iter__(self):
    items = self._do("iter")
    if type(items) is not list:
      raise TypeError("a program iterable did not produce a list")
    return iter(items)

  def __getitem__(self, key):
    return self._do("getitem", key=key)

  def __contains__(self, key):
    return self._do("contains", key=key) is True

  def __len__(self):
    try:  # a TypeError here lets list()/set() fall back to iterating (a generator has no len)
      value = self._do("len")
    except ProgramError as e:
      raise TypeError(str(e)) from None
    if type(value) is not int:
      raise TypeError("a program len() is not an int")
    return value

  def __bool__(self):
    return self._do("bool") is True

  def __str__(self):
    value = self._do("str")
    return value if type(value) is str else ""

  def __repr__(self):
    return f"<program object {object.__getattribute__(self, '_ref')}>"


def judge(request: dict, program: Program) -> tuple[str, str]:
  """(status, detail): runs the tests here against the program's names."""
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  exec(compile(request["setup"], "setup.py", "exec"), namespace)
  program.send(
    wire.dumps({"setup": request["setup"], "program": request["program"]}, wire.no_handle)
  )
  ok, init = program.receive()
  if not ok or type(init) is not dict:
    return "failed", str(init)
  for name, module in init["modules"].items():
    if type(module) is str and module in sys.stdlib_module_names and module not in _NO_IMPORT:
      namespace[name] = importlib.import_module(module)
  for name, value in init["names"].items():
    if type(name) is str:
      namespace[name] = value
  try:
    exec(compile(request["tests"], "tests.py", "exec"), namespace)
  except _Stop:
    raise
  except AssertionError as e:
    return "failed", f"AssertionError: {str(e)[:500]}"
  except BaseException as e:  # noqa: BLE001 - a test that errors is a failed test
    return "failed", f"{type(e).__name__}: {str(e)[:500]}"
  return "passed", ""


def main() -> None:
  config = wire.loads(sys.argv[1])
  if config["mode"] != "unsafe":
    confine.make_non_dumpable()
    confine.build_root(config["binds"], int(config["tmp_bytes"]), int(config["tmp_files"]))
  deadline = time.monotonic() + float(config["timeout"])
  program = Program(*start_program(config), deadline, int(config["max_output"]))
  request = wire.loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
  try:
    status, detail = judge(request, program)
  except _Stop as e:
    status, detail = e.status, e.detail
  returncode = program.finish()
  output = program.output.decode("utf-8", "replace")
  if detail:
    output += ("\n" if output and not output.endswith("\n") else "") + detail + "\n"
  verdict = {"status": status, "returncode": returncode, "output": output}
  sys.stdout.write(wire.dumps(verdict, wire.no_handle))
  sys.stdout.flush()


if __name__ == "__main__":
  main()
