"""A reward for smoke runs and tests: a deterministic function of the completion's text alone.

A random model never solves a task, so with task rewards every smoke run scores 0, ES's fitness
is constant (z = 0, a no-op step) and GRPO's advantages vanish: resume and sharding tests would
compare weights that never moved. `char_parity` varies with every token a model emits, so
members and samples score differently and the weights move. It measures nothing about reasoning.
"""

from __future__ import annotations


def char_parity_reward(completion: str, example: dict | None = None) -> float:
  """The share of the completion's characters whose code point is odd (0 for an empty one)."""
  del example  # the score ignores the problem on purpose
  if not completion:
    return 0.0
  return sum(ord(c) & 1 for c in completion) / len(completion)


def char_parity_correct(completion: str, example: dict | None = None) -> bool:
  """True when more than half of the characters are odd: a Pass@k that can vary."""
  return char_parity_reward(completion, example) > 0.5


def char_parity_answer_key(completion: str) -> str | None:
  """The completion's parity class, so Maj@k has something to vote on."""
  return str(int(char_parity_correct(completion))) if completion else None
