"""The smoke-run reward: hand-computed values, and that it is reachable by name."""

from es_jax import rewards


def test_char_parity_hand_computed_and_registered():
  # "a" = 97 (odd), "b" = 98 (even), "c" = 99 (odd): 2 of 3 odd.
  assert rewards.char_parity_reward("abc", {}) == 2 / 3
  assert rewards.char_parity_reward("", {}) == 0.0
  assert rewards.get_reward("char_parity")("bb", {}) == 0.0
  assert rewards.is_correct("abc", {}, task="char_parity")
  assert not rewards.is_correct("ab", {}, task="char_parity")  # 1/2 is not > 1/2
  assert rewards.answer_key("abc", task="char_parity") == "1"
  assert rewards.answer_key("", task="char_parity") is None
