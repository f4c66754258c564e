"""Judge of the code sandbox (es_jax.rewards.code); never imported by es_jax.

Started by `run_sandboxed` as `python -I -S _sandbox_judge.py CONFIG`, normally by `unshare` as
PID 1 of fresh network, PID, mount and IPC namespaces (plus a user namespace when not root).
CONFIG (limits, mode, directories; nothing secret) is in the argument vector; the program, setup
and tests come on stdin, read only after the program process has been forked; the verdict goes
to stdout. All three use the small codec below (`dumps`/`loads`): plain data only, parsed by
hand, so nothing the program sends is ever evaluated.

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
import ctypes
import fcntl
import importlib
import io
import os
import resource
import select
import signal
import sys
import time

NOBODY = 65534
ROOT = "/tmp"  # mount point (in this mount namespace) of the program's root
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
_MAX_MESSAGE = 8 << 20
_MAX_DEPTH = 100
# Standard-library modules the program may import that the tests may use by the same name; these
# are imported here (trusted code). Modules with import-time side effects are left out.
_NO_IMPORT = {"antigravity", "this", "idlelib", "turtle", "turtledemo", "tkinter", "webbrowser"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
  ctypes.c_char_p,
  ctypes.c_char_p,
  ctypes.c_char_p,
  ctypes.c_ulong,
  ctypes.c_char_p,
]


def _check(result: int, what: str) -> None:
  if result != 0:
    errno = ctypes.get_errno()
    raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()  # noqa: E731
  _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _bind_read_only(source: str, target: str) -> None:
  try:
    _mount(source, target, None, _MS_BIND)
  except OSError:  # a user namespace refuses a non-recursive bind over locked submounts
    _mount(source, target, None, _MS_BIND | _MS_REC)
  # Keep the source's flags that a user namespace may not clear (atime, noexec); add ro/nosuid.
  st = os.statvfs(source).f_flag
  flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
  for st_flag, ms_flag in (
    (8, _MS_NOEXEC),
    (1024, _MS_NOATIME),
    (2048, _MS_NODIRATIME),
    (4096, _MS_RELATIME),
  ):
    if st & st_flag:
      flags |= ms_flag
  _mount(None, target, None, flags)


def build_root(binds: list[str], tmp_bytes: int, tmp_files: int) -> None:
  """The program's filesystem: see the module docstring, step 1."""
  _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
  _mount("sandbox", ROOT, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
  for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", *binds):
    if not os.path.lexists(path) or os.path.lexists(ROOT + path):
      continue
    if os.path.islink(path) and os.path.dirname(path) == "/":
      os.symlink(os.readlink(path), ROOT + path)  # merged /usr: /bin -> usr/bin
    elif os.path.isdir(path):
      os.makedirs(ROOT + path)
      _bind_read_only(path, ROOT + path)
  os.makedirs(ROOT + "/dev")
  with open(ROOT + "/dev/null", "w"):
    pass
  try:
    _bind_read_only("/dev/null", ROOT + "/dev/null")
  except OSError:
    pass  # programs that open os.devnull fail; nothing else needs it
  os.makedirs(ROOT + "/tmp")
  options = f"size={tmp_bytes},nr_inodes={tmp_files},mode=1777"
  _mount("sandbox-tmp", ROOT + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, options)
  _mount(None, ROOT, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _enter_nested_user_namespace() -> None:
  """In a user namespace of our own, map uid/gid 65534 to ours: after setresuid(65534) the
  program holds no capability in any namespace (so no chroot escape, remount or ptrace)."""
  _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
  for name, text in (
    ("setgroups", "deny"),
    ("uid_map", f"{NOBODY} 0 1"),
    ("gid_map", f"{NOBODY} 0 1"),
  ):
    with open(f"/proc/self/{name}", "w") as f:
      f.write(text)


# --------------------------------------------------------------------------------------- codec
# One value per message: N None, T/F bools, i<hex>; int, f<repr>; float, c<re>,<im>; complex,
# b<hex>; bytes, h<id>; handle, s<n>:<n chars> str, and l/t/S/z/d<n>: list, tuple, set,
# frozenset, dict (n items, or n key-value pairs). Exact types only: subclasses are handles.


def dumps(value, handle) -> str:
  """`value` as codec text; `handle(obj)` gives the id of anything that is not plain data."""
  out = []
  _dump(value, handle, out, 0)
  return "".join(out)


def _dump(value, handle, out, depth):
  kind = type(value)
  if value is None:
    out.append("N")
  elif kind is bool:
    out.append("T" if value else "F")
  elif kind is int:
    out.append(f"i{value:#x};")
  elif kind is float:
    out.append(f"f{value!r};")
  elif kind is str:
    out.append(f"s{len(value)}:{value}")
  elif kind is complex:
    out.append(f"c{value.real!r},{value.imag!r};")
  elif kind is bytes:
    out.append(f"b{value.hex()};")
  elif kind in (list, tuple, set, frozenset, dict) and depth < _MAX_DEPTH:
    tag = {list: "l", tuple: "t", set: "S", frozenset: "z", dict: "d"}[kind]
    out.append(f"{tag}{len(value)}:")
    for item in value.items() if kind is dict else value:
      for part in item if kind is dict else (item,):
        _dump(part, handle, out, depth + 1)
  else:
    out.append(f"h{int(handle(value))};")


def loads(text: str, resolve=None):
  """The value in codec text; `resolve(id)` turns a handle into an object (None: refused)."""
  value, end = _load(text, 0, resolve, 0)
  if end != len(text):
    raise ValueError("codec: trailing data")
  return value


def _load(text, i, resolve, depth):
  if depth > _MAX_DEPTH + 1:
    raise ValueError("codec: nested too deeply")
  tag, i = text[i], i + 1
  if tag in "NTF":
    return {"N": None, "T": True, "F": False}[tag], i
  if tag in "ifcbh":
    end = text.index(";", i)
    body, i = text[i:end], end + 1
    if tag == "i":
      return int(body, 16), i
    if tag == "f":
      return float(body), i
    if tag == "c":
      real, imag = body.split(",")
      return complex(float(real), float(imag)), i
    if tag == "b":
      return bytes.fromhex(body), i
    if resolve is None:
      raise ValueError("codec: unexpected handle")
    return resolve(int(body)), i
  if tag not in "sltSzd":
    raise ValueError(f"codec: bad tag {tag!r}")
  end = text.index(":", i)
  count, i = int(text[i:end]), end + 1
  if not 0 <= count <= len(text) - i:
    raise ValueError("codec: bad length")
  if tag == "s":
    return text[i : i + count], i + count
  items = []
  for _ in range(2 * count if tag == "d" else count):
    item, i = _load(text, i, resolve, depth + 1)
    items.append(item)
  if tag == "d":
    return dict(zip(items[::2], items[1::2], strict=True)), i
  return {"l": list, "t": tuple, "S": set, "z": frozenset}[tag](items), i


def write_message(fd: int, text: str) -> None:
  """One length-prefixed message (blocking fd)."""
  data = text.encode("utf-8", "surrogatepass")
  data = memoryview(b"%d\n" % len(data) + data)
  while data:
    data = data[os.write(fd, data) :]


def read_message(fd: int) -> str | None:
  """One message from a blocking fd; None at end of file."""
  buffer = b""
  while b"\n" not in buffer:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return None
    buffer += chunk
  size, _, data = buffer.partition(b"\n")
  size = int(size)
  if size > _MAX_MESSAGE:
    raise ValueError("message too large")
  while len(data) < size:
    chunk = os.read(fd, min(1 << 20, size - len(data)))
    if not chunk:
      return None
    data += chunk
  return data.decode("utf-8", "surrogatepass")


# -------------------------------------------------------------------------------- program side


def _no_handle(value):
  raise TypeError(f"cannot pass a {type(value).__name__} to the program")


def serve(limits: list[int]) -> None:
  """The program process, after it entered its root and dropped privileges (never returns).

  fd 0: requests from the judge (one at a time, so plain blocking reads), 1 and 2: output,
  3: replies. Runs setup + program, then answers requests with plain data or handles.
  """
  cpu, memory, file_bytes = limits
  for limit, value in (
    (resource.RLIMIT_CPU, (cpu, cpu + 1)),
    (resource.RLIMIT_AS, (memory, memory)),
    (resource.RLIMIT_FSIZE, (file_bytes, file_bytes)),
    (resource.RLIMIT_NOFILE, (64, 64)),
    (resource.RLIMIT_CORE, (0, 0)),
    (resource.RLIMIT_NPROC, (0, 0)),  # no fork or thread (root ignores it: unsafe mode only)
  ):
    try:
      resource.setrlimit(limit, value)
    except (ValueError, OSError):
      pass
  sys.stdin = io.StringIO("")
  handles = []

  def handle(value):
    handles.append(value)
    return len(handles) - 1

  def reply(ok, value):
    try:
      text = dumps({"ok": ok, "v": value}, handle)
    except BaseException as e:  # noqa: BLE001 - e.g. MemoryError, RecursionError
      text = dumps({"ok": False, "v": f"{type(e).__name__} while encoding the result"}, None)
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except BaseException:  # noqa: BLE001
        pass
    write_message(3, text)

  def error(e):
    return f"{type(e).__name__}: {str(e)[:500]}"

  source = loads(read_message(0))
  # Speed bumps only (the namespaces, root and uid around this process are the boundary): the
  # usual ways to reach the network or start processes fail early with a clear error.
  for name in (
    "socket",
    "_socket",
    "ssl",
    "_ssl",
    "select",
    "selectors",
    "ctypes",
    "_ctypes",
    "subprocess",
    "_posixsubprocess",
    "multiprocessing",
    "_multiprocessing",
    "pty",
  ):
    sys.modules[name] = None
  for name in (
    "fork",
    "forkpty",
    "system",
    "popen",
    "kill",
    "killpg",
    "execv",
    "execve",
    "posix_spawn",
    "posix_spawnp",
    "setsid",
  ):
    if hasattr(os, name):
      delattr(os, name)
  namespace = {"__name__": "__main__", "__builtins__": builtins}
  absent = object()
  try:
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
    reply(True, {"names": names, "modules": modules})
  except BaseException as e:  # noqa: BLE001 - the program's own failure, reported
    reply(False, error(e))
    os._exit(1)
  while True:
    try:
      text = read_message(0)
      if text is None:
        break
      request = loads(text, handles.__getitem__)
      op, target = request["op"], request.get("target")
      if op == "call":
        value = target(*request["args"], **request["kwargs"])
      elif op == "attr":
        value = getattr(target, request["name"])
      elif op == "iter":
        value = list(target)
      elif op == "getitem":
        value = target[request["key"]]
      elif op == "contains":
        value = bool(request["key"] in target)
      elif op == "len":
        value = int(len(target))
      elif op == "bool":
        value = bool(target)
      else:  # "str"
        value = str(target)
        value = str.__str__(value) if isinstance(value, str) else ""
      reply(True, value)
    except BaseException as e:  # noqa: BLE001 - includes SystemExit from the program
      reply(False, error(e))
  os._exit(0)


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
        if mode == "userns":
          _enter_nested_user_namespace()
        os.chroot(ROOT)
        os.chdir("/tmp")
        if mode == "root":
          os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
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
    if not size.isdigit() or int(size) > _MAX_MESSAGE:
      raise _Stop("failed", "malformed or oversized reply from the program")
    size = int(size)
    self._buffer = rest
    while len(self._buffer) < size:
      self._read_some()
    data, self._buffer = self._buffer[:size], self._buffer[size:]
    try:
      reply = loads(data.decode("utf-8", "surrogatepass"), lambda ref: Proxy(self, ref))
      return bool(reply["ok"] is True), reply["v"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, MemoryError) as e:
      raise _Stop("failed", f"malformed reply from the program ({type(e).__name__})") from None

  def request(self, **message):
    self.send(dumps(message, _proxy_ref))
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
  return _no_handle(value)


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
  program.send(dumps({"setup": request["setup"], "program": request["program"]}, _no_handle))
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
  config = loads(sys.argv[1])
  if config["mode"] != "unsafe":
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    build_root(config["binds"], int(config["tmp_bytes"]), int(config["tmp_files"]))
  deadline = time.monotonic() + float(config["timeout"])
  program = Program(*start_program(config), deadline, int(config["max_output"]))
  request = loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
  try:
    status, detail = judge(request, program)
  except _Stop as e:
    status, detail = e.status, e.detail
  returncode = program.finish()
  output = program.output.decode("utf-8", "replace")
  if detail:
    output += ("\n" if output and not output.endswith("\n") else "") + detail + "\n"
  verdict = {"status": status, "returncode": returncode, "output": output}
  sys.stdout.write(dumps(verdict, _no_handle))
  sys.stdout.flush()


if __name__ == "__main__":
  main()
