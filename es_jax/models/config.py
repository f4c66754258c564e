"""Model configuration and presets for the Llama / Qwen2 decoder family."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

ARCHITECTURES = ("llama", "qwen2")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
  """Llama-3 style RoPE frequency scaling (`rope_type: "llama3"` in HF configs)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Hyper-parameters of a Llama/Qwen2-family decoder.

  Frozen and hashable: it is a static argument of every jitted function that takes it.
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  intermediate_size: int
  head_dim: int | None = None  # Defaults to hidden_size // num_heads.
  rope_theta: float = 10_000.0
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False
  tie_embeddings: bool = False
  norm_eps: float = 1e-6
  max_position_embeddings: int = 8192
  dtype: str = "float32"  # Parameter and activation dtype; softmax and norms run in float32.
  architecture: str = "llama"

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
        f"ModelConfig.architecture={self.architecture!r} is not supported; "
        f"use one of {ARCHITECTURES}."
      )
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
        f"num_kv_heads={self.num_kv_heads} (grouped-query attention)."
      )
    if self.head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(
          f"ModelConfig.hidden_size={self.hidden_size} is not divisible by num_heads="
          f"{self.num_heads}; set head_dim explicitly."
        )
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE.")
    jnp.dtype(self.dtype)  # Raises on an unknown dtype name.

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  def replace(self, **kwargs: Any) -> ModelConfig:
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
    q, kv = self.num_heads * hd, self.num_kv_heads * hd
    layer = 2 * d + d * (q + 2 * kv) + q * d + 3 * d * f
    if self.qkv_bias:
      layer += q + 2 * kv
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * layer + d + head


_LLAMA3_SCALING = RopeScaling(
  factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

PRESETS: dict[str, ModelConfig] = {
  # Tiny models for tests: vocab 256 (byte-level), one with each architecture's features.
  "tiny-llama": ModelConfig(
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    rope_theta=10_000.0,
    norm_eps=1e-6,
    max_position_embeddings=512,
  ),
  "tiny-qwen2": ModelConfig(
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    rope_theta=1e6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position_embeddings=512,
    architecture="qwen2",
  ),
  "smollm2-135m": ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    intermediate_size=1536,
    rope_theta=100_000.0,
    tie_embeddings=True,
    norm_eps=1e-5,
    max_position_embeddings=8192,
  ),
  "qwen2.5-0.5b": ModelConfig(
    vocab_size=151936,
    hidden_size=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    intermediate_size=4864,
    rope_theta=1e6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position_embeddings=32768,
    dtype="bfloat16",
    architecture="qwen2",
  ),
  "qwen2.5-1.5b": ModelConfig(
    vocab_size=151936,
    hidden_size=1536,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    intermediate_size=8960,
    rope_theta=1e6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position_embeddings=32768,
    dtype="bfloat16",
    architecture="qwen2",
  ),
  "qwen2.5-3b": ModelConfig(
    vocab_size=151936,
    hidden_size=2048,
    num_layers=36,
    num_heads=16,
    num_kv_heads=2,
    intermediate_size=11008,
    rope_theta=1e6,
    qkv_bias=True,
    tie_embeddings=True,
    max_position_embeddings=32768,
    dtype="bfloat16",
    architecture="qwen2",
  ),
  "qwen2.5-7b": ModelConfig(
    vocab_size=152064,
    hidden_size=3584,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    intermediate_size=18944,
    rope_theta=1e6,
    qkv_bias=True,
    tie_embeddings=False,
    max_position_embeddings=32768,
    dtype="bfloat16",
    architecture="qwen2",
  ),
  "llama-3.2-1b": ModelConfig(
    vocab_size=128256,
    hidden_size=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    intermediate_size=8192,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_SCALING,
    tie_embeddings=True,
    norm_eps=1e-5,
    max_position_embeddings=131072,
    dtype="bfloat16",
  ),
  "llama-3.2-3b": ModelConfig(
    vocab_size=128256,
    hidden_size=3072,
    num_layers=28,
    num_heads=24,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=8192,
    rope_theta=500_000.0,
    rope_scaling=_LLAMA3_SCALING,
    tie_embeddings=True,
    norm_eps=1e-5,
    max_position_embeddings=131072,
    dtype="bfloat16",
  ),
  "deepseek-r1-distill-qwen-1.5b": ModelConfig(
    vocab_size=151936,
    hidden_size=1536,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    intermediate_size=8960,
    rope_theta=10_000.0,
    qkv_bias=True,
    tie_embeddings=False,
    max_position_embeddings=131072,
    dtype="bfloat16",
    architecture="qwen2",
  ),
}


def get_config(name: str, **overrides: Any) -> ModelConfig:
  """Returns the preset `name` (case-insensitive), with field overrides."""
  key = name.lower()
  if key not in PRESETS:
    raise KeyError(f"Unknown model preset {name!r}; known presets: {sorted(PRESETS)}.")
  return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]
