"""Child process that runs symbolic checks for es_jax.rewards.verifier (never imported by es_jax).

Started as `python -I _verifier_worker.py MEMORY_BYTES`. Reads length-prefixed pickled requests
{"op": str, "args": dict} from stdin (written only by the trusted parent) and answers each with one
JSON line {"ok": bool, "value" | "error": ...} on the original stdout; anything a library prints
goes to stderr, which the parent discards. Exits when stdin closes.
"""

import ast
import io
import json
import os
import pickle
import resource
import struct
import sys
import tokenize

_SCORERS = {}
_MAX_PARSE_CHARS = 1000
# reasoning-gym scorers that call the builtin `eval` on the model's answer (or the gold answer).
# Their module-level name `eval` is rebound to `_literal_eval`, which accepts Python literals
# only (lists, tuples, strings, numbers...): all those scorers expect, and no code runs.
# tests/rewards_test.py checks that no other scorer calls eval/exec.
EVAL_SCORER_MODULES = (
  "reasoning_gym.algorithmic.binary_matrix",
  "reasoning_gym.algorithmic.number_sorting",
  "reasoning_gym.algorithmic.spiral_matrix",
  "reasoning_gym.algorithmic.string_insertion",
  "reasoning_gym.games.n_queens",
)
# sympy's parse_expr (and sympify, which calls it on strings) evaluates the text as Python with
# sympy's namespace and the builtins in scope: `__import__('os').system(...)` runs. Replaced, in
# this process, by `safe_parse_expr`: the text must tokenize to numbers, operators from
# _SAFE_OPS and plain names (no keyword, no "__", no attribute access, no string, no
# subscript), and is evaluated with empty builtins and only the sympy names in _SAFE_NAMES;
# every other name becomes a sympy Symbol (or an undefined Function when called). Without
# strings, attributes or builtins there is no path from the text to a Python object other than
# sympy numbers, symbols and these functions.
_SAFE_OPS = {
  "+",
  "-",
  "*",
  "/",
  "**",
  "^",
  "(",
  ")",
  ",",
  "!",
  "%",
  "=",
  "<",
  ">",
  "<=",
  ">=",
  "==",
  "!=",
}
_SAFE_NAMES = (
  "Symbol Function Integer Float Rational Number Add Mul Pow Eq Ne Lt Le Gt Ge Abs Max Min "
  "sqrt root exp log ln sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh "
  "atanh factorial binomial gamma floor ceiling sign re im pi E I oo zoo nan Integral Derivative "
  "Sum Product diff integrate"
).split()
_SAFE_GLOBALS = None


def _literal_eval(source, *args):
  if not isinstance(source, str) or len(source) > _MAX_PARSE_CHARS:
    raise ValueError("answer is not a short Python literal")
  return ast.literal_eval(source)


def safe_parse_expr(s, local_dict=None, transformations=None, global_dict=None, evaluate=True):
  """sympy's parse_expr restricted to arithmetic text (see the comment on _SAFE_OPS)."""
  global _SAFE_GLOBALS
  from sympy.parsing import sympy_parser

  if not isinstance(s, str) or len(s) > _MAX_PARSE_CHARS or not s.isascii():
    raise ValueError("expression is not short ASCII text")
  for token in tokenize.generate_tokens(io.StringIO(s).readline):
    kind, text = token.type, token.string
    if kind in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.NUMBER):
      continue
    if kind == tokenize.NAME and "__" not in text and not _keyword(text):
      continue
    if kind in (tokenize.OP, tokenize.ERRORTOKEN) and text in _SAFE_OPS:
      continue
    if kind == tokenize.ERRORTOKEN and not text.strip():
      continue
    raise ValueError(f"expression token {text!r} is not allowed")
  if _SAFE_GLOBALS is None:
    import sympy

    _SAFE_GLOBALS = {name: getattr(sympy, name) for name in _SAFE_NAMES}
    _SAFE_GLOBALS["__builtins__"] = {}
  if transformations is None:
    transformations = sympy_parser.standard_transformations
  return _ORIGINAL_PARSE_EXPR[0](
    s,
    local_dict=local_dict,
    transformations=transformations,
    global_dict=dict(_SAFE_GLOBALS),
    evaluate=evaluate,
  )


def _keyword(text):
  import keyword

  return keyword.iskeyword(text)


_ORIGINAL_PARSE_EXPR = []


def _harden_sympy():
  """Points every public path to parse_expr at safe_parse_expr (sympify imports it lazily)."""
  if _ORIGINAL_PARSE_EXPR:
    return
  import sympy
  import sympy.parsing
  from sympy.parsing import sympy_parser

  _ORIGINAL_PARSE_EXPR.append(sympy_parser.parse_expr)
  for module in (sympy, sympy.parsing, sympy_parser):
    module.parse_expr = safe_parse_expr


def _harden_reasoning_gym():
  import importlib

  for name in EVAL_SCORER_MODULES:
    importlib.import_module(name).eval = _literal_eval
  for name, module in list(sys.modules.items()):  # `from sympy... import parse_expr` copies
    if name.startswith("reasoning_gym") and getattr(module, "parse_expr", None) is not None:
      if module.parse_expr is _ORIGINAL_PARSE_EXPR[0]:
        module.parse_expr = safe_parse_expr


def _warm(module):
  if module not in ("math_verify", "reasoning_gym"):
    raise ValueError(f"unknown module {module!r}")
  _harden_sympy()  # before the import, so `from sympy.parsing import parse_expr` gets ours
  __import__(module)
  if module == "reasoning_gym":
    _harden_reasoning_gym()
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
