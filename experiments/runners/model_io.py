"""A run's model in and out: loading config.model from any source (the bundled default, HF, GGUF,
an Orbax checkpoint, or a random preset for smoke runs) and exporting trained params as an HF
directory."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from es_jax import models
from es_jax.models import gguf_loader
from es_jax.persist import checkpoint as checkpoint_lib
from experiments.runners import run_data


def load_model(model_config: Mapping[str, Any], *, seed: int = 0):
  """(Transformer, tokenizer) for config.model.

  Sources: "default" (the bundled SmolLM2-135M-Instruct GGUF), "hf" and "gguf" (`path`),
  "orbax" (`path` a checkpoint directory of `es_jax.persist.checkpoint.Checkpointer`, `step`
  optional; `base_source`/`base_path` give the architecture and tokenizer), and "random": the preset
  `model.preset` (e.g. "tiny-llama") with random weights from the run's `init` key and its
  vocabulary widened to the bundled SmolLM2 tokenizer's, for smoke runs and tests.

  `model.dtype` is the compute dtype: "" keeps the checkpoint's (bf16 for the paper's HF
  checkpoints; float32 for dequantised GGUF files), or "bfloat16" / "float32" / "float16".
  """
  source, path = model_config.get("source"), model_config.get("path") or ""
  dtype = model_config.get("dtype") or ""
  if source == "random":
    preset = model_config.get("preset") or ""
    tokenizer = gguf_loader.default_tokenizer()
    cfg = dataclasses.replace(models.get_config(preset), vocab_size=len(tokenizer))
    cfg = cfg.replace(dtype=dtype or cfg.dtype)
    seed_int = int(jax.random.randint(run_data.run_keys(seed)["init"], (), 0, 2**31 - 1))
    return models.Transformer(cfg, rngs=nnx.Rngs(seed_int)), tokenizer
  if source == "default":
    return models.load_default(dtype=dtype or "float32")
  if source == "hf":
    return models.load_hf(path, dtype=dtype or None)
  if source == "gguf":
    return models.load_gguf(path, dtype=dtype or "float32")
  base = {"source": model_config.get("base_source") or "default", "dtype": dtype}
  base["path"] = model_config.get("base_path")
  step = model_config.get("step")
  params = restore_params(path, step=None if step is None else int(step))
  model, tokenizer = load_model(base)
  # The checkpoint's params keep their dtype (float32 masters of a bf16 model stay float32);
  # the model computes in the base config's dtype (`forward` casts).
  return models.from_params(model.config, params), tokenizer


def restore_params(directory: str, *, step: int | None = None) -> dict[str, Any]:
  """The params of an Orbax checkpoint written with `es_jax.persist.checkpoint.Checkpointer`.

  The checkpoint's state is the params dict itself or a mapping holding it under "params".

  Args:
    directory: the checkpoint directory (local or gs://).
    step: the step to restore; None for the newest readable one.

  Raises:
    FileNotFoundError: no such local directory, or no checkpoint in it.
  """
  if "://" not in str(directory) and not os.path.isdir(directory):
    raise FileNotFoundError(f"config.model.path={directory!r}: no such checkpoint directory.")
  checkpointer = checkpoint_lib.Checkpointer(directory, async_save=False)
  try:
    state = checkpointer.restore(step).state
  finally:
    checkpointer.close()
  if isinstance(state, Mapping) and "params" in state:
    state = state["params"]
  return jax.tree.map(jnp.asarray, state)


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
