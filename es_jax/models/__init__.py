"""Llama/Qwen2-family decoder in flax.nnx with HF and GGUF loaders."""

from es_jax.models.attention import KVCache, init_cache, take_rows, unstack_cache
from es_jax.models.config import PRESETS, ModelConfig, RopeScaling, get_config
from es_jax.models.gguf_loader import default_gguf_path, load_default, load_gguf
from es_jax.models.hf import load_hf, save_hf
from es_jax.models.transformer import (
  ForwardMode,
  Transformer,
  cast_params,
  forward,
  from_params,
  param_shapes,
  params,
  positions_from_mask,
  set_params,
  unstack_layers,
)
