"""Hugging Face checkpoints: config.json + *.safetensors + tokenizer files, no torch needed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from es_jax.models.config import ModelConfig, RopeScaling
from es_jax.models.transformer import (
  Params,
  Transformer,
  check_param_shapes,
  from_params,
  param_shapes,
)

_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# HF tensor name per layer -> (our name, transpose to input-major).
_LAYER_TENSORS = {
  "input_layernorm.weight": ("attn_norm", False),
  "self_attn.q_proj.weight": ("wq", True),
  "self_attn.k_proj.weight": ("wk", True),
  "self_attn.v_proj.weight": ("wv", True),
  "self_attn.o_proj.weight": ("wo", True),
  "self_attn.q_proj.bias": ("bq", False),
  "self_attn.k_proj.bias": ("bk", False),
  "self_attn.v_proj.bias": ("bv", False),
  "post_attention_layernorm.weight": ("mlp_norm", False),
  "mlp.gate_proj.weight": ("w_gate", True),
  "mlp.up_proj.weight": ("w_up", True),
  "mlp.down_proj.weight": ("w_down", True),
}


def config_from_hf(hf: dict[str, Any], source: str = "config.json") -> ModelConfig:
  """Maps an HF config dict (transformers 4.x or 5.x layout) to a ModelConfig."""
  model_type = hf.get("model_type")
  if model_type not in _MODEL_TYPES:
    raise ValueError(
      f"{source}: model_type={model_type!r} is not supported; es_jax loads "
      f"{sorted(_MODEL_TYPES)} (Llama and Qwen2 architectures)."
    )
  rope = dict(hf.get("rope_parameters") or {})
  legacy = hf.get("rope_scaling") or {}
  rope.update({k: v for k, v in legacy.items() if k not in rope})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  scaling = None
  if rope_type == "llama3":
    scaling = RopeScaling(
      factor=float(rope["factor"]),
      low_freq_factor=float(rope["low_freq_factor"]),
      high_freq_factor=float(rope["high_freq_factor"]),
      original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )
  elif rope_type not in ("default", None):
    raise ValueError(f"{source}: rope_type={rope_type!r} is not supported (default, llama3).")
  try:
    num_heads = hf["num_attention_heads"]
    return ModelConfig(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim"),
      intermediate_size=hf["intermediate_size"],
      rope_theta=float(theta),
      rope_scaling=scaling,
      qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
      dtype="float32",
      architecture=model_type,
    )
  except KeyError as e:
    raise ValueError(f"{source}: required field {e.args[0]!r} is missing.") from None


def config_to_hf(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
  c = config
  rope: dict[str, Any] = {"rope_theta": c.rope_theta, "rope_type": "default"}
  if c.rope_scaling is not None:
    s = c.rope_scaling
    rope.update(
      rope_type="llama3",
      factor=s.factor,
      low_freq_factor=s.low_freq_factor,
      high_freq_factor=s.high_freq_factor,
      original_max_position_embeddings=s.original_max_position_embeddings,
    )
  hf = {
    "architectures": [_MODEL_TYPES[c.architecture]],
    "model_type": c.architecture,
    "vocab_size": c.vocab_size,
    "hidden_size": c.hidden_size,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "intermediate_size": c.intermediate_size,
    "hidden_act": "silu",
    "rms_norm_eps": c.norm_eps,
    "rope_parameters": rope,
    "rope_theta": c.rope_theta,
    "tie_word_embeddings": c.tie_embeddings,
    "max_position_embeddings": c.max_position_embeddings,
    "dtype": dtype,
  }
  if c.architecture == "llama":
    hf["attention_bias"] = c.qkv_bias
    hf["mlp_bias"] = False
  return hf


def _read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """Every tensor of the directory's *.safetensors files as float32, and the file of each."""
  from safetensors import safe_open

  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"{path}: no *.safetensors files (need config.json + weights).")
  tensors: dict[str, np.ndarray] = {}
  origin: dict[str, str] = {}
  for f in files:
    try:
      # framework="flax" reads bfloat16 too (numpy has no bf16); to host numpy as float32.
      with safe_open(str(f), framework="flax") as fh:
        for name in fh.keys():
          if name in origin:
            raise ValueError(f"{f}: tensor {name!r} is also in {origin[name]}.")
          t = fh.get_tensor(name)
          if not jnp.issubdtype(t.dtype, jnp.floating):
            raise ValueError(f"{f}: tensor {name!r} has dtype {t.dtype}; expected floats.")
          tensors[name], origin[name] = np.asarray(t, dtype=np.float32), str(f)
    except ValueError:
      raise
    except Exception as e:  # noqa: BLE001 - safetensors' errors do not name the file
      raise ValueError(
        f"{f}: not a readable safetensors file (truncated or corrupt?): {type(e).__name__}: {e}"
      ) from e
  return tensors, origin


def check_finite(name: str, t: np.ndarray, where: str) -> None:
  """Raises ValueError naming tensor `name` of `where` if it holds NaN or ±inf."""
  ok = np.isfinite(t)
  if not ok.all():
    bad = np.argwhere(~ok)
    first = tuple(int(i) for i in bad[0])
    raise ValueError(
      f"{where}: tensor {name!r} holds {len(bad)} NaN/inf value(s) (first at index {first}, "
      f"{t[first]}); the checkpoint is corrupt or was saved after a diverged update."
    )


def params_from_hf_tensors(
  tensors: dict[str, np.ndarray],
  config: ModelConfig,
  source: str = "checkpoint",
  files: dict[str, str] | None = None,
) -> Params:
  """Maps HF-named tensors ([out, in] layout) to the stacked es_jax params dict.

  Every tensor used is checked for its shape under `config` and for NaN/inf; errors name the
  tensor and its file (`files[name]`, else `source`).
  """
  c = config
  dtype = c.jnp_dtype
  shapes = param_shapes(c)
  files = files or {}
  used: set[str] = set()

  def take(name, ours_shape, transpose=False):
    where = files.get(name, source)
    if name not in tensors:
      raise ValueError(f"{source}: tensor {name!r} is missing.")
    used.add(name)
    t = tensors[name]
    want = tuple(reversed(ours_shape)) if transpose else tuple(ours_shape)
    if tuple(t.shape) != want:
      raise ValueError(
        f"{where}: tensor {name!r} has shape {tuple(t.shape)}, expected {want} for this config."
      )
    check_finite(name, t, where)
    return t.T if transpose else t

  layers: dict[str, list[np.ndarray]] = {}
  for i in range(c.num_layers):
    for hf_name, (ours, transpose) in _LAYER_TENSORS.items():
      if ours.startswith("b") and not c.qkv_bias:
        continue
      t = take(f"model.layers.{i}.{hf_name}", shapes["layers"][ours][1:], transpose)
      layers.setdefault(ours, []).append(t)
  p: Params = {
    "embed": jnp.asarray(take("model.embed_tokens.weight", shapes["embed"]), dtype),
    "layers": {k: jnp.asarray(np.stack(v), dtype) for k, v in layers.items()},
    "final_norm": jnp.asarray(take("model.norm.weight", shapes["final_norm"]), dtype),
  }
  if not c.tie_embeddings:
    p["lm_head"] = jnp.asarray(take("lm_head.weight", shapes["lm_head"], True), dtype)
  _check_unused(tensors, used, config, source, files)
  check_param_shapes(c, p, source)
  return p


def _check_unused(
  tensors: dict[str, np.ndarray], used: set[str], config: ModelConfig, source: str, files
) -> None:
  """Raises ValueError naming a tensor the model does not use (a wrong architecture or config).

  Legitimate extras pass: rotary `inv_freq` buffers (recomputed from rope_theta) and, with tied
  embeddings, an `lm_head.weight` equal to the embedding (a saved copy of the tie).
  """
  extra = sorted(n for n in tensors if n not in used and not n.endswith(".rotary_emb.inv_freq"))
  head = "lm_head.weight"
  if config.tie_embeddings and head in extra:
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None or not np.array_equal(tensors[head], embed):
      raise ValueError(
        f"{files.get(head, source)}: tensor {head!r} differs from model.embed_tokens.weight but "
        "config.json sets tie_word_embeddings=true (the model would ignore it); set it to false "
        "or drop the tensor."
      )
    extra.remove(head)
  if extra:
    more = f" (and {len(extra) - 1} more: {', '.join(extra[1:4])}...)" if len(extra) > 1 else ""
    raise ValueError(
      f"{files.get(extra[0], source)}: tensor {extra[0]!r} is not used by this "
      f"{config.architecture} config{more}; the checkpoint does not match its config.json "
      "(another architecture, bias, layer count or tie_word_embeddings)."
    )


def params_to_hf_tensors(params: Params, config: ModelConfig) -> dict[str, np.ndarray]:
  out = {
    "model.embed_tokens.weight": params["embed"],
    "model.norm.weight": params["final_norm"],
  }
  for i in range(config.num_layers):
    for hf_name, (ours, transpose) in _LAYER_TENSORS.items():
      if ours in params["layers"]:
        t = params["layers"][ours][i]
        out[f"model.layers.{i}.{hf_name}"] = t.T if transpose else t
  if "lm_head" in params:
    out["lm_head.weight"] = params["lm_head"].T
  return out


def load_tokenizer(path: str | os.PathLike):
  from transformers import AutoTokenizer

  path = Path(path)
  if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
    raise FileNotFoundError(
      f"{path}: no tokenizer.json or tokenizer_config.json; pass tokenizer=False to load "
      "weights only."
    )
  return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_hf(path: str | os.PathLike, *, dtype: str | None = None, tokenizer: bool = True):
  """Loads a local HF Llama/Qwen2 directory. Returns (Transformer, tokenizer or None).

  Args:
    path: directory with config.json, one or more *.safetensors files and tokenizer files.
    dtype: parameter dtype; defaults to the checkpoint's `dtype`/`torch_dtype` (float32 if
      absent).
    tokenizer: also load the tokenizer (transformers' AutoTokenizer, local files only).
  """
  path = Path(path)
  cfg_file = path / "config.json"
  if not cfg_file.exists():
    raise FileNotFoundError(f"{cfg_file}: not found; is {path} an HF model directory?")
  try:
    hf = json.loads(cfg_file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    where = f" (line {e.lineno}, column {e.colno})" if hasattr(e, "lineno") else ""
    raise ValueError(f"{cfg_file}: not valid JSON{where}: {getattr(e, 'msg', e)}.") from None
  if not isinstance(hf, dict):
    raise ValueError(f"{cfg_file}: expected a JSON object, got {type(hf).__name__}.")
  config = config_from_hf(hf, str(cfg_file))
  dtype = dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32"
  config = config.replace(dtype=str(dtype))
  tensors, files = _read_safetensors(path)
  params = params_from_hf_tensors(tensors, config, str(path), files)
  model = from_params(config, params)
  return model, (load_tokenizer(path) if tokenizer else None)


def save_hf(model: Transformer, tokenizer, path: str | os.PathLike, *, dtype: str | None = None):
  """Writes `model` (and `tokenizer`, if given) as an HF directory transformers can load."""
  from safetensors.numpy import save_file

  from es_jax.models.transformer import params as get_params

  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  config = model.config
  dtype = dtype or config.dtype
  p = get_params(model)
  tensors = {
    k: np.ascontiguousarray(np.asarray(jnp.asarray(v, dtype)))
    for k, v in params_to_hf_tensors(p, config).items()
  }
  if dtype == "bfloat16":
    # numpy's safetensors writer has no bf16; the flax writer does.
    from safetensors.flax import save_file as save_flax

    save_flax(
      {k: jnp.asarray(v) for k, v in tensors.items()},
      str(path / "model.safetensors"),
      metadata={"format": "pt"},
    )
  else:
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  hf = config_to_hf(config, dtype)
  if tokenizer is not None:
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
      value = getattr(tokenizer, field, None)
      if value is not None:
        hf[field] = value
    tokenizer.save_pretrained(str(path))
  (path / "config.json").write_text(json.dumps(hf, indent=2))
  return path
