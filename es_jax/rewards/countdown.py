"""Countdown reward (Qiu et al. 2025, after TinyZero): 0.1 × format + answer.

    r = 0.1 · format + answer,   format ∈ [0, 1],  answer ∈ {0, 1}

format = 1 when the whole completion is `<think>…</think>\\n<answer>…</answer>`; otherwise 0.1
for a `<think>…</think>` block plus 0.5 for an `<answer>…</answer>` block (so 0, 0.1, 0.5 or
0.6). Pass `think_prefilled=True` when the prompt already ends with "<think>".

answer = 1 when the last `<answer>` holds an expression that (a) uses only digits, + - * / ( )
and whitespace, at most 200 characters, (b) uses each number of `example["nums"]` exactly once,
and (c) equals `example["target"]` exactly (rational arithmetic). The expression is parsed with
`ast` and evaluated by a walker that knows only integer literals, + - * / and unary ±: no `eval`,
no names, no calls, no `**` or `//`; division by zero makes it invalid.
"""

import ast
import re
from fractions import Fraction

from es_jax.rewards import extract

MAX_EXPRESSION_CHARS = 200
_ALLOWED_RE = re.compile(r"[0-9+\-*/()\s]+", re.ASCII)
_BINARY = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: a / b,
}


class _Invalid(Exception):
  pass


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body, used)
  if isinstance(node, ast.Constant) and type(node.value) is int:
    used.append(node.value)
    return Fraction(node.value)
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _evaluate(node.left, used), _evaluate(node.right, used)
    if isinstance(node.op, ast.Div) and right == 0:
      raise _Invalid("division by zero")
    return _BINARY[type(node.op)](left, right)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    value = _evaluate(node.operand, used)
    return -value if isinstance(node.op, ast.USub) else value
  raise _Invalid(f"{type(node).__name__} is not allowed")


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]] | None:
  """(value, integer literals in order) of an arithmetic expression, or None when invalid."""
  expression = expression.strip()
  if not expression or len(expression) > MAX_EXPRESSION_CHARS:
    return None
  if not _ALLOWED_RE.fullmatch(expression):
    return None
  try:
    tree = ast.parse(expression, mode="eval")
    used: list[int] = []
    return _evaluate(tree, used), used
  except (SyntaxError, ValueError, RecursionError, MemoryError, _Invalid):
    return None


def format_score(completion: str, *, think_prefilled: bool = False) -> float:
  """1.0 for the full think/answer layout, else 0.1 (think block) + 0.5 (answer block)."""
  if think_prefilled:
    completion = "<think>" + completion
  completion = completion.strip()
  # Full layout "<think>…</think>\n<answer>…</answer>", checked with find (linear time).
  head, sep, tail = "<think>", "</think>\n<answer>", "</answer>"
  middle = completion.find(sep, len(head))
  if (
    completion.startswith(head)
    and completion.endswith(tail)
    and middle >= 0
    and middle + len(sep) <= len(completion) - len(tail)
  ):
    return 1.0
  score = 0.0
  close = completion.find("</think>")
  if close >= 0 and completion.rfind("<think>", 0, close) >= 0:
    score += 0.1
  if extract.last_tag(completion, "answer") is not None:
    score += 0.5
  return score


def _fields(example: dict) -> tuple[list[int], int]:
  for field in ("nums", "target"):
    if field not in example:
      raise KeyError(f"countdown reward: example has no {field!r} (keys: {sorted(example)}).")
  return [int(n) for n in example["nums"]], int(example["target"])


def countdown_correct(completion: str, example: dict) -> bool:
  """Whether the last `<answer>` expression uses each number once and reaches the target."""
  nums, target = _fields(example)
  expression = extract.last_tag(completion, "answer")
  result = None if expression is None else evaluate_expression(expression)
  if result is None:
    return False
  value, used = result
  return sorted(used) == sorted(nums) and value == target


def countdown_reward(completion: str, example: dict, *, think_prefilled: bool = False) -> float:
  """0.1 × format_score + answer (1.0 when `countdown_correct`)."""
  answer = float(countdown_correct(completion, example))
  return 0.1 * format_score(completion, think_prefilled=think_prefilled) + answer


def countdown_answer_key(completion: str) -> str | None:
  """The answer expression without whitespace, for majority voting."""
  expression = extract.last_tag(completion, "answer")
  return None if expression is None else re.sub(r"\s+", "", expression)
