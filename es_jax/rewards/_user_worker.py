"""Child process that imports and calls a user's reward for es_jax.rewards.user (never imported by
es_jax).

Started as `python -I _user_worker.py`. Reads length-prefixed pickled requests from stdin (written
only by the parent) and answers each with a length-prefixed pickled tuple on the original stdout;
anything the user's code prints goes to stderr. Requests:

  ("load", module_name, function_name, sys_path) -> ("ready",) or ("failed", message, traceback)
  ("call", completion, example)                   -> ("value", float), ("bad", repr, type name)
                                                     or ("raised", message, traceback)

Every exception, SystemExit and KeyboardInterrupt included, is reported, not obeyed: only the
parent ends this process (by closing stdin or killing it). Exits when stdin closes.
"""

import importlib
import importlib.util
import inspect
import math
import numbers
import os
import pickle
import struct
import sys
import traceback

_HEADER = struct.Struct("<I")


class _Unusable(Exception):
  """The module imported, but holds no usable function."""


def _read(stream):
  header = stream.read(_HEADER.size)
  if len(header) < _HEADER.size:
    return None
  (size,) = _HEADER.unpack(header)
  return pickle.loads(stream.read(size))


def _write(stream, reply) -> None:
  payload = pickle.dumps(reply)
  stream.write(_HEADER.pack(len(payload)) + payload)
  stream.flush()


def _failure(e: BaseException) -> tuple[str, str, str]:
  text = " ".join(str(e).split())
  return ("raised", f"{type(e).__name__}: {text}" if text else type(e).__name__, _trace(e))


def _trace(e: BaseException) -> str:
  return "".join(traceback.format_exception(type(e), e, e.__traceback__))


def _load(module_name: str, attr: str):
  """The user's function; raises what importing raised, or _Unusable."""
  if module_name.endswith(".py"):
    spec = importlib.util.spec_from_file_location("_user_reward", module_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["_user_reward"] = module  # dataclasses and pickling look the module up
    spec.loader.exec_module(module)
  else:
    module = importlib.import_module(module_name)
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise _Unusable(f"{module_name} has no function {attr!r}")
  try:
    inspect.signature(fn).bind("", {})
  except TypeError:
    raise _Unusable(
      f"{attr} must take (completion: str, example: dict) and return a float"
    ) from None
  except ValueError:  # a builtin without a signature: trust it
    pass
  return fn


def _score(fn, completion: str, example: dict) -> tuple:
  try:
    value = fn(completion, example)
  except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
    return _failure(e)
  is_numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
  if isinstance(value, numbers.Real) or is_numpy_bool:
    try:
      number = float(value)
    except (OverflowError, ValueError, TypeError):
      number = math.nan
    if math.isfinite(number):
      return ("value", number)
  try:
    text = repr(value)
  except BaseException:  # noqa: BLE001 - a hostile __repr__
    text = "<unprintable>"
  return ("bad", text[:80], type(value).__name__)


def _die_with_parent() -> None:
  """Linux: SIGKILL when the parent dies, even inside a call that never returns."""
  try:
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def main() -> None:
  _die_with_parent()
  wire = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)  # the user's prints (Python or C level) go to stderr, never onto the wire
  sys.stdout = sys.stderr
  requests = os.fdopen(os.dup(0), "rb")
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)  # the user's code reads nothing of the requests
  sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
  fn = None
  while (request := _read(requests)) is not None:
    if request[0] == "load":
      _, module_name, attr, path = request
      sys.path[:] = path
      try:
        fn = _load(module_name, attr)
        reply = ("ready",)
      except _Unusable as e:
        reply = ("failed", str(e), "")
      except BaseException as e:  # noqa: BLE001 - an import that raises or exits, reported
        _, message, trace = _failure(e)
        reply = ("failed", f"importing {module_name} failed: {message}", trace)
    else:
      reply = _score(fn, request[1], request[2])
    _write(wire, reply)


if __name__ == "__main__":
  main()
