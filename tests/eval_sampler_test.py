"""Evaluation batch layout (experiments/evaluation/sampler.py): the queue layout (`refill`) draws
each sample with its own key, whatever the batch size, and resumes to the same samples."""

import jax
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_tokenizer

from es_jax import models
from es_jax.decode.sampling import Decoding, generate, pad_prompts
from experiments.evaluation import sampler as eval_sampler

N, NEW_TOKENS = 3, 8
EXAMPLES = [{"prompt": f"Add {i} and {7 * i}."} for i in range(5)]


@pytest.fixture(scope="module")
def tiny():
  model = models.Transformer(models.get_config("tiny-llama"), rngs=nnx.Rngs(0))
  return models.params(model), model.config, tiny_tokenizer()


def _scorer(tiny, batch_size, refill):
  p, cfg, tok = tiny
  return eval_sampler.BlockScorer(
    p,
    cfg,
    tok,
    n=N,
    batch_size=batch_size,
    decoding=Decoding(NEW_TOKENS, 1.0, eos_ids=(tok.eos_token_id,), pad_id=0),
    greedy=False,
    prompt_fn=lambda ex: ex["prompt"],
    correct_fn=lambda text, ex: len(text) % 2 == 0,
    answer_fn=lambda text: text[:1] or None,
    refill=refill,
  )


def _score(scorer, block, done=()):
  return dict(scorer.score_block(EXAMPLES, block, set(done), jax.random.key(3)))


def test_queue_samples_follow_their_keys_whatever_the_batch_size(tiny):
  """Sample s of problem p (in block order) is generate's row with key fold_in(block_key,
  p·n + s): the same with 2 or 4 rows, and after a resume that skips finished problems."""
  p, cfg, tok = tiny
  block = range(1, 5)
  two = _score(_scorer(tiny, 2, True), block[:2])  # a block of 2 problems: 6 samples, 2 rows
  four = _score(_scorer(tiny, 4, True), block)  # 4 problems: 12 samples, 4 rows
  prompts = [tok.encode(EXAMPLES[i]["prompt"], add_special_tokens=False) for i in block]
  ids, mask = pad_prompts([prompts[r // N] for r in range(4 * N)], pad_id=0)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(3), np.arange(4 * N))
  decoding = Decoding(NEW_TOKENS, 1.0, eos_ids=(tok.eos_token_id,))
  ref = generate(p, ids, mask, decoding, config=cfg, key=keys)  # one key per row
  texts = tok.batch_decode(
    [np.asarray(ref.tokens)[r][np.asarray(ref.mask)[r]] for r in range(4 * N)],
    skip_special_tokens=True,
  )
  lengths = np.asarray(ref.lengths)
  for q, i in enumerate(block):
    assert four[i]["texts"] == texts[q * N : (q + 1) * N]
    assert four[i]["lengths"] == lengths[q * N : (q + 1) * N].tolist()
    if i in two:
      assert two[i]["texts"] == four[i]["texts"]
  resumed = _score(_scorer(tiny, 4, True), block, done=(1, 3))
  assert sorted(resumed) == [2, 4]
  for i in resumed:
    assert resumed[i]["texts"] == four[i]["texts"]
    assert resumed[i]["correct"] == four[i]["correct"]


def test_static_layout_is_unchanged_by_the_refill_switch(tiny):
  """Without `refill`, batch j of a block draws with fold_in(block_key, j), as before."""
  p, cfg, tok = tiny
  block = range(0, 2)
  static = _score(_scorer(tiny, 4, False), block)
  prompts = [tok.encode(EXAMPLES[i]["prompt"], add_special_tokens=False) for i in block]
  rows = [min(r // N, 1) for r in range(4)]  # batch 0: problem 0's 3 samples, problem 1's first
  ids, mask = pad_prompts([prompts[r] for r in rows], pad_id=0)
  key = jax.random.fold_in(jax.random.key(3), 0)
  decoding = Decoding(NEW_TOKENS, 1.0, eos_ids=(tok.eos_token_id,))
  ref = generate(p, ids, mask, decoding, config=cfg, key=key)
  first = tok.batch_decode(
    [np.asarray(ref.tokens)[r][np.asarray(ref.mask)[r]] for r in range(N)],
    skip_special_tokens=True,
  )
  assert static[0]["texts"] == first
