"""Llama/Qwen2-family decoder in flax.nnx with HF and GGUF loaders."""

from es_jax.models.config import PRESETS, ModelConfig, RopeScaling, get_config
from es_jax.models.gguf_loader import default_gguf_path, load_default, load_gguf
from es_jax.models.hf import load_hf, save_hf
from es_jax.models.transformer import (
  KVCache,
  Transformer,
  cast_params,
  forward,
  from_params,
  init_cache,
  param_shapes,
  params,
  positions_from_mask,
  set_params,
  unstack_cache,
  unstack_layers,
)
