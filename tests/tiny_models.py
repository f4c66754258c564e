"""Tiny random checkpoints and tokenizers for tests (written on the fly; nothing downloaded)."""

from __future__ import annotations

import numpy as np

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_vocab(size: int = 256) -> tuple[list[str], list[tuple[str, str]]]:
  """A byte-level BPE vocabulary of exactly `size` tokens: printable bytes, a few merges,
  and the special tokens last."""
  from tokenizers.pre_tokenizers import ByteLevel

  alphabet = sorted(ByteLevel.alphabet())
  merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("1", "2")]
  n_bytes = size - len(SPECIAL) - len(merges)
  # Keep the characters the merges and test strings need, drop rare high bytes.
  needed = {c for pair in merges for s in pair for c in s}
  chars = [c for c in alphabet if c in needed or ord(c) < 0x17F][:n_bytes]
  tokens = chars + ["".join(m) for m in merges] + SPECIAL
  assert len(tokens) == size, len(tokens)
  return tokens, merges


def tiny_tokenizer(size: int = 256):
  """A transformers fast tokenizer over `byte_vocab`, with a ChatML-style template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tokens, merges = byte_vocab(size)
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
  tok.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False),
    ]
  )
  tok.decoder = decoders.ByteLevel()
  return PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    bos_token="<|im_start|>",
    additional_special_tokens=SPECIAL,
    chat_template=CHAT_TEMPLATE,
    padding_side="left",
  )


def torch_model(arch: str, *, seed: int = 0, **overrides):
  """A tiny random HF (PyTorch) model with O(1) logits, so layout bugs cannot hide."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

  common = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=254,
    eos_token_id=255,
    pad_token_id=253,
  )
  common.update(overrides)
  if arch == "llama":
    cfg = LlamaConfig(**common)
    cls = LlamaForCausalLM
  elif arch == "qwen2":
    cfg = Qwen2Config(**common)
    cls = Qwen2ForCausalLM
  else:
    raise ValueError(arch)
  torch.manual_seed(seed)
  model = cls(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif p.ndim == 1:
        p.copy_(0.2 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) / np.sqrt(p.shape[1]))
  return model


def es_jax_port(model):
  """(es_jax params, ModelConfig) of an HF PyTorch model such as `torch_model`'s, in float32."""
  from es_jax.models.hf import config_from_hf, params_from_hf_tensors

  cfg = config_from_hf(model.config.to_dict())
  tensors = {k: v.float().numpy() for k, v in model.state_dict().items()}
  return params_from_hf_tensors(tensors, cfg), cfg


def torch_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Logits from the HF model with explicit left-padding-aware position ids."""
  import torch

  pos = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask.astype(np.int64)),
      position_ids=torch.tensor(pos, dtype=torch.long),
    )
  return out.logits.float().numpy()


def padded_batch(seed: int = 0, batch: int = 3, length: int = 12, vocab: int = 250):
  rng = np.random.RandomState(seed)
  ids = rng.randint(0, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), bool)
  for b in range(1, batch):
    mask[b, : (b * 4) % length] = False
  ids[~mask] = 0
  return ids, mask


def micro_config(**overrides):
  """A micro `es_jax.models.ModelConfig` (Llama-like: 2 layers of width 16, vocab 32, GQA 2:1)
  for tests that build params from shapes; `overrides` replace fields."""
  from es_jax.models import ModelConfig

  fields = dict(
    vocab_size=32,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    max_position_embeddings=64,
  )
  return ModelConfig(**{**fields, **overrides})


def random_params(
  config, seed: int = 0, *, norms: str = "one", vectors: float | None = None, xp=None
):
  """Random params of `config`'s shapes, in numpy (no per-shape init compiles), one
  `rng.randn` per leaf in `param_shapes` order.

  Matrices: randn / sqrt(fan_in) (O(1) logits, so greedy tokens have no near-ties). norms: "one"
  gives norm weights 1 + 0.1 randn, "scaled" treats them as vectors. vectors: the scale of other
  1-D leaves and bias leaves ("b*"), None gives them randn (the matrix rule with fan-in 1).
  xp: jax.numpy (default) or numpy, the array type returned (float32).
  """
  import jax.numpy as jnp

  from es_jax.models import param_shapes

  xp = jnp if xp is None else xp
  rng = np.random.RandomState(seed)

  def init(name, shape):
    if norms == "one" and name.endswith("norm"):
      return 1.0 + 0.1 * rng.randn(*shape)
    if vectors is not None and (len(shape) == 1 or name.startswith("b")):
      return vectors * rng.randn(*shape)
    return rng.randn(*shape) / np.sqrt(shape[-2] if len(shape) > 1 else 1)

  def build(tree):
    return {
      k: build(v) if isinstance(v, dict) else xp.asarray(init(k, v), xp.float32)
      for k, v in tree.items()
    }

  return build(param_shapes(config))


def transformers_greedy(ref, ids, mask, max_new_tokens: int) -> np.ndarray:
  """The new tokens of transformers' greedy `generate` on left-padded prompts (no EOS, pad 0):
  the reference the decoders' greedy tokens are compared with."""
  import torch

  with torch.no_grad():
    out = ref.generate(
      input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
      attention_mask=torch.tensor(np.asarray(mask).astype(np.int64)),
      max_new_tokens=max_new_tokens,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=0,
    )
  return out[:, np.asarray(ids).shape[1] :].numpy()
