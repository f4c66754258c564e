"""A run's model in and out: loading config.model (with random presets for smoke runs) and
exporting trained params as an HF directory."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from es_jax import models
from es_jax.models import gguf_loader
from experiments import evaluate, run_data
from experiments.config_check import check


def load_model(model_config: Mapping[str, Any], *, seed: int = 0):
  """(Transformer, tokenizer) for config.model.

  Sources: those of `experiments.evaluate.load_model` (default, hf, gguf, orbax) plus "random":
  the preset `model.preset` (e.g. "tiny-llama") with random weights from the run's `init` key and
  its vocabulary widened to the bundled SmolLM2 tokenizer's, for smoke runs and tests.
  """
  if model_config.get("source") != "random":
    return evaluate.load_model(model_config)
  preset = model_config.get("preset") or ""
  check(preset in models.PRESETS, "model.preset", preset, f"use one of {sorted(models.PRESETS)}")
  tokenizer = gguf_loader.default_tokenizer()
  cfg = dataclasses.replace(models.get_config(preset), vocab_size=len(tokenizer))
  dtype = model_config.get("dtype") or ""
  check(dtype in evaluate.MODEL_DTYPES, "model.dtype", dtype, f"use one of {evaluate.MODEL_DTYPES}")
  cfg = cfg.replace(dtype=dtype or cfg.dtype)
  seed_int = int(jax.random.randint(run_data.run_keys(seed)["init"], (), 0, 2**31 - 1))
  return models.Transformer(cfg, rngs=nnx.Rngs(seed_int)), tokenizer


def export_hf(params, model_config: models.ModelConfig, tokenizer, path: str) -> str:
  """Writes params as an HF directory (config.json, safetensors, tokenizer) that transformers
  and vLLM load; returns the path."""
  models.save_hf(models.from_params(model_config, params), tokenizer, path)
  return path


def model_label(model_config: Mapping[str, Any]) -> str:
  """A short name of config.model for log lines."""
  source = model_config.get("source")
  if source == "default":
    return "bundled SmolLM2-135M-Instruct"
  if source == "random":
    return f"random {model_config.get('preset')}"
  return f"{source} {model_config.get('path')}"
