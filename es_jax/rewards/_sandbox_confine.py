"""What confines the code sandbox's program process (steps 1-2 of `_sandbox_judge.py`).

The judge builds the program's root (`build_root`) and makes itself non-dumpable before it forks
the program process; that process enters the root and drops its privileges (`enter_root`), sets
its rlimits (`set_limits`) and removes the usual ways to the network and to new processes
(`add_speed_bumps`). Standard library only: the judge runs as `python -I -S` and loads this file
by path, before it forks, so the program process never imports anything after `enter_root`.
"""

import ctypes
import os
import resource
import sys

NOBODY = 65534
ROOT = "/tmp"  # mount point (in this mount namespace) of the program's root
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38

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


def make_non_dumpable() -> None:
  """No ptrace of, or core dump from, the judge (it holds the tests and writes the verdict)."""
  _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")


def enter_root(mode: str) -> None:
  """In the program process (isolated modes): chroot into the root of `build_root`, become
  uid/gid 65534 with no groups (in "userns" mode inside a nested user namespace, so with no
  capability), and set no_new_privs."""
  if mode == "userns":
    _enter_nested_user_namespace()
  os.chroot(ROOT)
  os.chdir("/tmp")
  if mode == "root":
    os.setgroups([])
  os.setresgid(NOBODY, NOBODY, NOBODY)
  os.setresuid(NOBODY, NOBODY, NOBODY)
  _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def set_limits(limits: list[int]) -> None:
  """The program process's rlimits: `limits` = [CPU seconds, address space, file size] bytes."""
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


# Speed bumps only (the namespaces, root and uid around the program are the boundary): the usual
# ways to reach the network or start processes fail early with a clear error.
_BLOCKED_MODULES = (
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
)
_REMOVED_OS_FUNCTIONS = (
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
)


def add_speed_bumps() -> None:
  """Blocks the imports of `_BLOCKED_MODULES` and removes `_REMOVED_OS_FUNCTIONS` from `os`."""
  for name in _BLOCKED_MODULES:
    sys.modules[name] = None
  for name in _REMOVED_OS_FUNCTIONS:
    if hasattr(os, name):
      delattr(os, name)
