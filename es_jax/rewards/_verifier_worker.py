"""Child process that runs symbolic checks for es_jax.rewards.verifier (never imported by es_jax).

Started as `python -I _verifier_worker.py MEMORY_BYTES`. Reads length-prefixed pickled requests
{"op": str, "args": dict} from stdin (written only by the trusted parent) and answers each with one
JSON line {"ok": bool, "value" | "error": ...} on the original stdout; anything a library prints
goes to stderr, which the parent discards. Exits when stdin closes.
"""

import json
import os
import pickle
import resource
import struct
import sys

_SCORERS = {}


def _warm(module):
  if module not in ("math_verify", "reasoning_gym"):
    raise ValueError(f"unknown module {module!r}")
  __import__(module)
  return True


def _math_equal(gold, pred, inner_timeout):
  from math_verify import parse, verify

  # math-verify's own signal.alarm timeouts work here: this is the main thread of this process.
  gold_parsed = parse(f"${gold}$", parsing_timeout=inner_timeout)
  pred_parsed = parse(f"${pred}$", parsing_timeout=inner_timeout)
  if not gold_parsed or not pred_parsed:
    return False
  return bool(verify(gold_parsed, pred_parsed, timeout_seconds=inner_timeout))


def _rg_score(name, answer, entry):
  if name not in _SCORERS:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
      return None  # the parent raises a ValueError naming the dataset
    _SCORERS[name] = reasoning_gym.get_score_answer_fn(name)
  return float(_SCORERS[name](answer, entry))


_HANDLERS = {"warm": _warm, "math_equal": _math_equal, "rg_score": _rg_score}


def main():
  memory = int(sys.argv[1])
  resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  reply = os.fdopen(os.dup(1), "wb", buffering=0)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  requests = sys.stdin.buffer
  reply.write(b'{"ok": true, "value": "ready"}\n')
  while True:
    header = requests.read(4)
    if len(header) < 4:
      return
    (size,) = struct.unpack("<I", header)
    payload = requests.read(size)
    if len(payload) < size:
      return
    try:
      request = pickle.loads(payload)
      value = _HANDLERS[request["op"]](**request["args"])
      out = {"ok": True, "value": value}
    except BaseException as e:  # noqa: BLE001 - report every failure, keep serving
      # Only the type: str() of a sympy error can itself be slow.
      out = {"ok": False, "error": type(e).__name__}
    reply.write((json.dumps(out) + "\n").encode())


if __name__ == "__main__":
  main()
