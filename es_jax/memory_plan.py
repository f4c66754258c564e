"""Per-chip memory of the project's programs, predicted without compiling (pure Python).

`experiments.tpu_plan` compiles the programs for a TPU topology and reads the compiler's figures;
this module predicts the same figures from the model config and the program settings, so runners
can refuse a configuration that cannot fit before loading anything (`check_fits`). The formulas
count the buffers that dominate each program (weights, per-member copies, the KV cache, logits,
activations); `experiments/benchmarks/tpu_paper_configs.py --compare` prints predicted against
compiled bytes (docs/tpu_plan.md has the table).

Sizes are bytes per chip. `pop` and `model` are the mesh axes (es_jax.sharding): the population or
batch is split over `pop`, large matrices over `model` (es_jax.sharding.leaf_spec).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from es_jax.models.config import ModelConfig

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator as the compiler sees it (a device), with its published peak figures."""

  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bandwidth: float  # bytes/s


# Per chip, from the Cloud TPU system-architecture pages (docs.cloud.google.com/tpu/docs/v4, /v5e,
# /v5p-training, /v6e; read 2026-12): v4 275 TFLOP/s bf16, 32 GiB at 1200 GB/s; v5e 197 TFLOP/s,
# 16 GB at 819 GB/s; v5p 459 TFLOP/s, 95 GB at 2765 GB/s; v6e 918 TFLOP/s, 32 GB at 1638 GB/s.
# libtpu's v4 topologies have one device per TensorCore (two per chip): half of each figure.
CHIPS = {
  "v4": Chip("TPU v4 (one TensorCore)", 16 * GIB, 275e12 / 2, 1200e9 / 2),
  "v5e": Chip("TPU v5e", 16 * GIB, 197e12, 819e9),
  "v5p": Chip("TPU v5p", 95 * GIB, 459e12, 2765e9),
  "v6e": Chip("TPU v6e", 32 * GIB, 918e12, 1638e9),
}


def chip_for(topology: str) -> Chip:
  """The `Chip` of a topology name such as "v5e:2x4" (the part before the colon)."""
  kind = topology.split(":")[0].lower()
  if kind not in CHIPS:
    raise ValueError(f"topology={topology!r}: unknown chip {kind!r}; use one of {sorted(CHIPS)}.")
  return CHIPS[kind]


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Predicted bytes per chip of one program."""

  argument: int
  output: int
  temp: int

  @property
  def total(self) -> int:
    return self.argument + self.output + self.temp


def _itemsize(dtype: str) -> int:
  return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(dtype), 4)


def _matrix_split(shape: tuple[int, ...], model: int, min_size: int = 2**18) -> int:
  """How many ways es_jax.sharding.leaf_spec splits a leaf of `shape` (1 or `model`)."""
  if model == 1 or len(shape) < 2 or math.prod(shape) < min_size:
    return 1
  return model if any(shape[a] % model == 0 for a in (len(shape) - 2, len(shape) - 1)) else 1


def _leaf_shapes(c: ModelConfig) -> list[tuple[int, ...]]:
  L, D, F = c.num_layers, c.hidden_size, c.intermediate_size
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  shapes = [(L, D), (L, D, q), (L, D, kv), (L, D, kv), (L, q, D), (L, D), (L, D, F), (L, D, F)]
  shapes += [(L, F, D), (c.vocab_size, D), (D,)]
  if c.qkv_bias:
    shapes += [(L, q), (L, kv), (L, kv)]
  if not c.tie_embeddings:
    shapes.append((D, c.vocab_size))
  return shapes


def param_bytes(c: ModelConfig, model: int = 1, dtype: str | None = None) -> int:
  """Bytes of one copy of the parameters on one chip (matrices split over `model`)."""
  size = _itemsize(dtype or c.dtype)
  return sum(math.prod(s) // _matrix_split(s, model) * size for s in _leaf_shapes(c))


def kv_cache_bytes(c: ModelConfig, rows: int, length: int) -> int:
  """Keys and values of every layer for `rows` sequences of `length` slots."""
  return 2 * c.num_layers * rows * c.num_kv_heads * c.head_dim * length * _itemsize(c.dtype)


def low_rank_bytes(c: ModelConfig, rank: int) -> int:
  """One member's low-rank factors (a, b per hook matrix) and perturbed vectors, float32."""
  floats = 0
  for s in _leaf_shapes(c):
    if len(s) >= 2:
      floats += math.prod(s[:-2]) * (s[-2] + s[-1]) * rank
    else:
      floats += math.prod(s)
  return 4 * floats


def _decode_temp(c: ModelConfig, rows: int, prompt_len: int, max_new_tokens: int) -> int:
  """Working buffers of a decode loop over `rows` (cache, logits, prefill activations)."""
  length = prompt_len + max_new_tokens
  cache = kv_cache_bytes(c, rows, length)
  logits = rows * c.vocab_size * 4  # float32 logits of the current step
  prefill = rows * prompt_len * max(c.hidden_size, c.intermediate_size) * 4  # one layer's widest
  outputs = rows * max_new_tokens * 4 * 4  # tokens, logprobs, entropy, mask
  # The while loop keeps the cache in place; the prefill writes it once: one copy, plus logits
  # and per-step temporaries (x2: sampling softmax/probabilities next to the logits).
  return cache + 2 * logits + prefill + outputs


def generate_estimate(
  c: ModelConfig, *, rows: int, prompt_len: int, max_new_tokens: int, pop: int = 1, model: int = 1
) -> Estimate:
  """`sampling.generate` on `rows` prompts split over `pop` chips (eval sampling, GRPO rollout)."""
  local = -(-rows // pop)
  out = local * max_new_tokens * (4 + 4 + 4 + 1) + 4 * local
  return Estimate(
    argument=param_bytes(c, model) + 2 * local * prompt_len * 4,
    output=out,
    temp=_decode_temp(c, local, prompt_len, max_new_tokens),
  )


def population_estimate(
  c: ModelConfig,
  *,
  population_size: int,
  members_per_chunk: int,
  num_prompts: int,
  prompt_len: int,
  max_new_tokens: int,
  rank: int | None = None,
  pop: int = 1,
  model: int = 1,
) -> Estimate:
  """`population.population_completions`: one chunk of M members decoding M x P rows per chip."""
  M = members_per_chunk
  n_local = population_size // pop
  theta = param_bytes(c, model)
  if rank is None:
    # M perturbed copies of θ (and the noise of one member while it is drawn, float32).
    members = M * theta + param_bytes(c, model, "float32")
  else:
    members = M * low_rank_bytes(c, rank)
  out = n_local * num_prompts * max_new_tokens * (4 + 4 + 4 + 1) + 4 * n_local * num_prompts
  return Estimate(
    argument=theta + 2 * num_prompts * prompt_len * 4,
    output=out,
    temp=members + _decode_temp(c, M * num_prompts, prompt_len, max_new_tokens) + out,
  )


def es_update_estimate(
  c: ModelConfig, *, population_size: int, optimizer: str = "sgd", model: int = 1
) -> Estimate:
  """`experiments.es._apply`: θ and the optimizer state, donated; noise regenerated per member."""
  theta = param_bytes(c, model)
  state = theta + (2 * param_bytes(c, model, "float32") if optimizer == "adam" else 0)
  # The gradient accumulates in float32 while one member's noise is drawn at a time.
  return Estimate(argument=state + 4 * population_size, output=state, temp=3 * theta * 2)


def grpo_update_estimate(
  c: ModelConfig,
  *,
  rows: int,
  seq_len: int,
  completion_len: int,
  micro_batch_size: int,
  with_reference: bool,
  pop: int = 1,
  model: int = 1,
) -> Estimate:
  """`grpo_train._update_step`: AdamW state, float32 gradients, one micro-batch's activations."""
  theta = param_bytes(c, model)
  f32 = param_bytes(c, model, "float32")
  state = theta + 2 * f32  # params + Adam mu, nu (float32)
  local = rows // pop
  batch = local * seq_len * (4 + 1 + 1 + 4) + 4 * local
  m, size = micro_batch_size, _itemsize(c.dtype)
  # Saved activations for the backward pass: ~ (12 D + 3 F) values per token per layer, plus the
  # completion's float32 logits (and their softmax) for the micro-batch.
  acts = c.num_layers * m * seq_len * (12 * c.hidden_size + 3 * c.intermediate_size) * size
  logits = 3 * m * completion_len * c.vocab_size * 4
  frozen = (2 if with_reference else 1) * local * completion_len * 4
  return Estimate(
    argument=state + batch + (theta if with_reference else 0),
    output=state,
    temp=2 * f32 + acts + logits + frozen,
  )


def check_fits(estimate: Estimate, chip: Chip, *, program: str, setting: str) -> None:
  """Raises ValueError naming `setting` when `estimate` exceeds the chip's HBM."""
  if estimate.total > chip.hbm_bytes:
    raise ValueError(
      f"{program} needs about {estimate.total / GIB:.1f} GiB per chip (predicted) but a "
      f"{chip.name} has {chip.hbm_bytes / GIB:.1f} GiB: lower {setting}."
    )


def predict(
  program: str, config: Any, model_config: ModelConfig, *, pop: int, model: int, prompt_len: int
) -> Estimate:
  """The `Estimate` of one of experiments.tpu_plan's programs for an experiment config."""
  c, es, grpo, ev = model_config, config.es, config.grpo, config.eval
  prompts = int(config.data.prompts_per_step)
  rows = prompts * int(grpo.num_generations)
  if program == "es_population":
    return population_estimate(
      c, population_size=int(es.population_size), members_per_chunk=int(es.members_per_chunk),
      num_prompts=prompts, prompt_len=prompt_len, max_new_tokens=int(es.max_new_tokens),
      rank=int(es.rank) or None, pop=pop, model=model)  # fmt: skip
  if program == "es_update":
    return es_update_estimate(
      c, population_size=int(es.population_size), optimizer=es.optimizer, model=model
    )
  if program == "eval":  # one chip, rows unsplit (as experiments.eval_sampler runs it)
    return generate_estimate(
      c, rows=int(ev.batch_size), prompt_len=prompt_len, max_new_tokens=int(ev.max_new_tokens)
    )
  if program == "grpo_rollout":
    return generate_estimate(
      c, rows=rows, prompt_len=prompt_len, max_new_tokens=int(grpo.max_new_tokens), pop=pop,
      model=model)  # fmt: skip
  if program == "grpo_update":
    T = int(grpo.max_new_tokens)
    return grpo_update_estimate(
      c, rows=rows, seq_len=prompt_len + T, completion_len=T,
      micro_batch_size=int(grpo.micro_batch_size), with_reference=float(grpo.beta) > 0, pop=pop,
      model=model)  # fmt: skip
  raise ValueError(f"memory_plan.predict: unknown program {program!r}")


# The config field that shrinks each program (named in check_fits' errors).
SETTINGS = {
  "es_population": "config.es.members_per_chunk",
  "es_update": "config.mesh.model",
  "eval": "config.eval.batch_size",
  "grpo_rollout": "config.data.prompts_per_step",
  "grpo_update": "config.grpo.micro_batch_size",
}


def check_config_fits(
  config: Any,
  model_config: ModelConfig,
  chip: Chip,
  *,
  programs: tuple[str, ...],
  pop: int,
  model: int = 1,
  prompt_len: int = 256,
) -> None:
  """Raises ValueError naming the config field of the first program predicted not to fit."""
  for program in programs:
    estimate = predict(program, config, model_config, pop=pop, model=model, prompt_len=prompt_len)
    check_fits(estimate, chip, program=program, setting=SETTINGS[program])
