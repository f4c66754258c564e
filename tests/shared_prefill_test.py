"""The shared prefill (`Decoding.prefill_rows`: each run of equal prompt rows prefilled once) and
the prompt-length buckets (`sampling.bucket_length`)."""

import jax
import numpy as np
import pytest
from tiny_models import es_jax_port, torch_model, transformers_greedy

from es_jax.decode import loop as decode_loop
from es_jax.decode.sampling import Decoding, bucket_length, generate, pad_prompts, prompt_runs
from experiments.evaluation.sampler import problems_per_batch

PROMPTS = [[5, 17, 99, 3], [42, 7], [1, 2, 3, 4, 5, 6, 7]]
REPEATS = 3  # rows per prompt, adjacent (an evaluation's samples, a GRPO rollout's G)


@pytest.fixture(scope="module")
def tiny():
  """A tiny random Llama as (torch reference, es_jax params, config)."""
  ref = torch_model("llama")
  return ref, *es_jax_port(ref)


def _repeated():
  return pad_prompts([p for p in PROMPTS for _ in range(REPEATS)], pad_id=0, bucket=8)


def test_bucket_length_ladder():
  """Multiples of 16 up to 64, then of a quarter of the power of two below the length."""
  lengths = (1, 16, 17, 33, 47, 49, 64, 65, 100, 129, 257)
  want = (16, 16, 32, 48, 48, 64, 64, 80, 112, 160, 320)
  assert tuple(bucket_length(n) for n in lengths) == want
  assert bucket_length(47, 32) == 64 and bucket_length(5, 1) == 5
  assert pad_prompts([[1] * 47], pad_id=0)[0].shape == (1, 48)


def test_prompt_runs_finds_adjacent_equal_rows():
  ids, mask = pad_prompts([[1, 2], [1, 2], [3], [1, 2], [3], [3]], pad_id=0, bucket=4)
  assert prompt_runs(ids, mask) == 4
  first, run = decode_loop.prompt_runs(ids, mask, 5)
  np.testing.assert_array_equal(first, [0, 2, 3, 4, 0])  # the unused fifth run: row 0
  np.testing.assert_array_equal(run, [0, 0, 1, 2, 3, 3])
  # Equal ids with another mask are another prompt (a pad token id inside a prompt).
  ids2 = np.array([[0, 5], [0, 5]])
  mask2 = np.array([[False, True], [True, True]])
  assert prompt_runs(ids2, mask2) == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_shared_prefill_gives_each_rows_own_tokens(tiny, temperature):
  """Rows sharing a prefill draw what they draw with every row prefilled: the same tokens (row r
  still draws uniform(fold_in(key, t), (B,))[r]), logprobs equal up to float rounding."""
  _, p, cfg = tiny
  ids, mask = _repeated()
  decoding = Decoding(10, temperature, eos_ids=(255,), kv_chunk=4)
  key = jax.random.key(7)
  alone = generate(p, ids, mask, decoding, config=cfg, key=key)
  shared = generate(p, ids, mask, decoding.replace(prefill_rows=3), config=cfg, key=key)
  tokens = np.asarray(shared.tokens)
  np.testing.assert_array_equal(tokens, np.asarray(alone.tokens))
  np.testing.assert_array_equal(np.asarray(shared.lengths), np.asarray(alone.lengths))
  np.testing.assert_allclose(shared.logprobs, alone.logprobs, rtol=1e-5, atol=1e-5)
  if temperature:  # the rows of one prompt drew different continuations: rows are not copies
    assert len({tuple(t) for t in tokens[:REPEATS]}) > 1


def test_shared_prefill_greedy_matches_transformers(tiny):
  ref, p, cfg = tiny
  ids, mask = _repeated()
  out = generate(p, ids, mask, Decoding(12, prefill_rows=4), config=cfg, key=jax.random.key(0))
  expected = transformers_greedy(ref, ids, mask, 12)
  np.testing.assert_array_equal(np.asarray(out.tokens), expected)


def test_more_prompt_runs_than_prefill_rows_is_an_error(tiny):
  _, p, cfg = tiny
  ids, mask = _repeated()
  with pytest.raises(ValueError, match="3 runs .* Decoding.prefill_rows=2"):
    generate(p, ids, mask, Decoding(4, prefill_rows=2), config=cfg, key=jax.random.key(0))
  with pytest.raises(ValueError, match="Decoding.prefill_rows=0"):
    Decoding(4, prefill_rows=0)


@pytest.mark.parametrize("batch_size, n", [(32, 8), (68, 16), (4, 3), (7, 2), (5, 9)])
def test_problems_per_batch_bounds_every_batch(batch_size, n):
  """The evaluation's bound is the most problems any of its sampled batches holds."""
  most = 0
  for j in range(3 * n):
    rows = np.arange(j * batch_size, (j + 1) * batch_size)
    most = max(most, len(set(rows // n)))
  assert problems_per_batch(batch_size, n) == most
