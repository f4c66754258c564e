"""Per-chip memory of the project's programs, predicted without compiling (pure Python).

`experiments.tpu.plan` compiles the programs for a TPU topology and reads the compiler's figures;
this module predicts the same figures from a `ModelConfig` and each program's sizes (plain
numbers), so a run can refuse a configuration that cannot fit before loading anything
(`experiments.tpu.memory_check` reads those sizes from an experiment config). The formulas
count the buffers that dominate each program (weights, per-member copies, the KV cache, logits,
activations); `experiments/benchmarks/tpu_paper_configs.py --compare` prints predicted against
compiled bytes (docs/tpu_plan.md has the table).

Sizes are bytes per chip. A program's `Split` names its share of the mesh axes
(es_jax.devices.sharding):
the population or batch is split over `pop` devices, large matrices over `model`
(es_jax.devices.sharding.leaf_spec).
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
  kind: str = ""  # the key in CHIPS ("v5e", ...)


# Per chip, from the Cloud TPU system-architecture pages (docs.cloud.google.com/tpu/docs/v4, /v5e,
# /v5p-training, /v6e; read 2026-12): v4 275 TFLOP/s bf16, 32 GiB at 1200 GB/s; v5e 197 TFLOP/s,
# 16 GB at 819 GB/s; v5p 459 TFLOP/s, 95 GB at 2765 GB/s; v6e 918 TFLOP/s, 32 GB at 1638 GB/s.
# libtpu's v4 topologies have one device per TensorCore (two per chip): half of each figure.
CHIPS = {
  "v4": Chip("TPU v4 (one TensorCore)", 16 * GIB, 275e12 / 2, 1200e9 / 2, "v4"),
  "v5e": Chip("TPU v5e", 16 * GIB, 197e12, 819e9, "v5e"),
  "v5p": Chip("TPU v5p", 95 * GIB, 459e12, 2765e9, "v5p"),
  "v6e": Chip("TPU v6e", 32 * GIB, 918e12, 1638e9, "v6e"),
}
# jax.Device.device_kind of each chip (libtpu 0.0.42.1).
DEVICE_KINDS = {
  "TPU v4": "v4",
  "TPU v5 lite": "v5e",
  "TPU v5e": "v5e",
  "TPU v5": "v5p",
  "TPU v5p": "v5p",
  "TPU v6 lite": "v6e",
  "TPU v6e": "v6e",
}
PROMPT_LEN = 256  # padded prompt tokens assumed when the prompts are not known yet


def chip_for(topology: str) -> Chip:
  """The `Chip` of a topology name such as "v5e:2x4" (the part before the colon)."""
  kind = topology.split(":")[0].lower()
  if kind not in CHIPS:
    raise ValueError(f"topology={topology!r}: unknown chip {kind!r}; use one of {sorted(CHIPS)}.")
  return CHIPS[kind]


def chip_for_device(device: Any) -> Chip | None:
  """The `Chip` of a jax device (None for an unknown kind). Its HBM is the runtime's
  `memory_stats()["bytes_limit"]` when the device reports one (a v4 chip then counts as one
  device with both TensorCores' memory), else the published size."""
  kind = DEVICE_KINDS.get(str(getattr(device, "device_kind", "")))
  if kind is None:
    return None
  chip = CHIPS[kind]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # noqa: BLE001 (backends without memory stats raise various errors)
    stats = {}
  limit = int(stats.get("bytes_limit") or 0)
  return dataclasses.replace(chip, hbm_bytes=limit) if limit > 0 else chip


@dataclasses.dataclass(frozen=True)
class Split:
  """How a program is laid over the ('pop', 'model') mesh: its population or batch over `pop`
  devices, its large matrices over `model` devices."""

  pop: int = 1
  model: int = 1


@dataclasses.dataclass(frozen=True)
class TokenBatch:
  """A batch the GRPO update trains on: `rows` sequences of `seq_len` tokens whose last
  `completion_len` are the completion, in micro-batches of `micro_batch_size` rows."""

  rows: int
  seq_len: int
  completion_len: int
  micro_batch_size: int


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Predicted bytes per chip of one program (as `compiled.memory_analysis()` counts them)."""

  argument: int
  output: int
  temp: int
  alias: int = 0  # donated arguments that share their buffers with outputs

  @property
  def total(self) -> int:
    return self.argument + self.output - self.alias + self.temp


def _itemsize(dtype: str | None) -> int:
  return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(dtype), 4)


def _split(n: int, model: int) -> int:
  """The per-chip size of an axis of `n` that XLA splits over `model` devices (padded)."""
  return -(-n // model)


def _matrix_split(shape: tuple[int, ...], model: int, min_size: int = 2**18) -> int:
  """How many ways es_jax.devices.sharding.leaf_spec splits a leaf of `shape` (1 or `model`)."""
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


def largest_leaf_bytes(c: ModelConfig, model: int = 1, dtype: str | None = None) -> int:
  """Bytes on one chip of the largest parameter leaf (split over `model` as the params are)."""
  size = _itemsize(dtype or c.dtype)
  return max(math.prod(s) // _matrix_split(s, model) * size for s in _leaf_shapes(c))


def _embed_bytes(c: ModelConfig, model: int = 1, dtype: str | None = None) -> int:
  s = (c.vocab_size, c.hidden_size)
  return math.prod(s) // _matrix_split(s, model) * _itemsize(dtype or c.dtype)


def kv_cache_bytes(c: ModelConfig, rows: int, length: int, model: int = 1) -> int:
  """Keys and values of every layer for `rows` sequences of `length` slots, on one chip: the
  KV-head axis is split over `model` (padded: 2 heads over 4 chips leave 1 per chip)."""
  kv = _split(c.num_kv_heads, model)
  return 2 * c.num_layers * rows * kv * c.head_dim * length * _itemsize(c.dtype)


def low_rank_bytes(c: ModelConfig, rank: int) -> int:
  """One member's low-rank factors (a, b per hook matrix) and perturbed vectors, float32."""
  floats = 0
  for s in _leaf_shapes(c):
    if len(s) >= 2:
      floats += math.prod(s[:-2]) * (s[-2] + s[-1]) * rank
    else:
      floats += math.prod(s)
  return 4 * floats


def _decode_temp(
  c: ModelConfig, rows: int, prompt_len: int, max_new_tokens: int, model: int = 1
) -> int:
  """Working buffers of `sampling.generate` on `rows` rows (one chip).

  The peak is the prefill: the KV cache (written by it, live to the end) next to one layer's
  attention over the whole cache length, [rows, heads, prompt, prompt + budget] scores in
  float32 and their softmax (float32 too, before the cast) plus the boolean mask of the same
  shape. Heads follow the KV heads' split over `model`. The decode steps need less: the cache
  plus [rows, vocab] float32 logits and the sampler's copies of them.
  """
  length = prompt_len + max_new_tokens
  cache = kv_cache_bytes(c, rows, length, model)
  heads = _split(c.num_kv_heads, model) * (c.num_heads // c.num_kv_heads)
  scores = rows * heads * prompt_len * length
  logits = 4 * rows * _split(c.vocab_size, model) * 4
  return cache + 2 * 4 * scores + scores + logits


def generate_estimate(
  c: ModelConfig,
  *,
  rows: int,
  prompt_len: int,
  max_new_tokens: int,
  split: Split = Split(),
  param_dtype: str | None = None,
) -> Estimate:
  """`sampling.generate` on `rows` prompts split over `split.pop` chips (eval sampling, GRPO
  rollout).

  `param_dtype`: the dtype the params arrive in (GRPO's float32 masters); generate casts them
  once to the compute dtype, a copy that stays live through the loop.
  """
  pop, model = split.pop, split.model
  local = -(-rows // pop)
  out = local * max_new_tokens * (4 + 4 + 4 + 1) + 4 * local
  cast = 0 if _itemsize(param_dtype or c.dtype) == _itemsize(c.dtype) else param_bytes(c, model)
  return Estimate(
    argument=param_bytes(c, model, param_dtype) + 2 * local * prompt_len * 4,
    output=out,
    temp=cast + _decode_temp(c, local, prompt_len, max_new_tokens, model),
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
  split: Split = Split(),
) -> Estimate:
  """`population.population_completions`: one chunk of M members decoding M x P rows per chip.

  Full rank: the chunk's M perturbed copies of θ in the compute dtype, whole on every chip (the
  members are made inside the 'pop' shard_map, so they are not split over 'model', and neither is
  their decode), plus the noise of the member being drawn (split as θ is).
  """
  M = members_per_chunk
  n_local = population_size // split.pop
  theta = param_bytes(c, split.model)
  if rank is None:
    members = M * param_bytes(c) + theta
  else:
    members = M * low_rank_bytes(c, rank)
  out = n_local * num_prompts * max_new_tokens * (4 + 4 + 4 + 1) + 4 * n_local * num_prompts
  return Estimate(
    argument=theta + 2 * num_prompts * prompt_len * 4,
    output=out,
    temp=members + _decode_temp(c, M * num_prompts, prompt_len, max_new_tokens),
  )


# Float32 leaf-sized buffers live at once in the ES update (es_jax.es.gradient: the gradient is
# accumulated leaf by leaf in float32, one member's noise of the leaf drawn at a time): the
# accumulator and the noise; the v6e compiler overlaps the next leaf's accumulator as well.
UPDATE_LEAF_BUFFERS = {"v6e": 3}


def es_update_estimate(
  c: ModelConfig,
  *,
  population_size: int,
  optimizer: str = "sgd",
  split: Split = Split(),
  chip: str = "",
) -> Estimate:
  """`experiments.runners.es_runner._apply`: θ and the optimizer state, donated; the gradient is
  accumulated
  in float32 one leaf at a time, so the working set is a few float32 copies of the largest leaf."""
  model = split.model
  theta = param_bytes(c, model)
  moments = 2 * param_bytes(c, model, "float32") if optimizer == "adam" else 0
  state = theta + moments
  if model == 1:
    temp = UPDATE_LEAF_BUFFERS.get(chip, 2) * largest_leaf_bytes(c, 1, "float32")
  else:
    # Split weights: each chip still draws the whole leaf's noise (the generator does not split)
    # and slices its part: three whole float32 leaves (measured on v5e:2x4, model=4).
    temp = 3 * largest_leaf_bytes(c, 1, "float32")
  return Estimate(argument=state + 4 * population_size, output=state, alias=state, temp=temp)


def grpo_update_estimate(
  c: ModelConfig,
  batch: TokenBatch,
  *,
  with_reference: bool,
  split: Split = Split(),
  master_dtype: str | None = "float32",
  remat: bool = False,
) -> Estimate:
  """`grpo_update._update_step`: the state (masters, AdamW moments) donated, float32 gradient
  accumulators, the compute-dtype copy of the masters, and one micro-batch's saved activations.

  Per micro-batch of m rows of S tokens, for the backward pass XLA keeps every layer's attention
  scores (float32) and probabilities (compute dtype), [m, heads, S, S]; the MLP's gate, up and
  product with their cotangents, [m, S, F] (6 in the compute dtype); a few [m, S, D] values; and
  the completion's logits, [m, T, V], 3 in float32 and 4 in the compute dtype. Heads, F, D and
  V are split over `model` (heads as the KV heads are). A tied embedding gets a second
  gradient (and compute copy) for its use as the output layer.

  With `remat` (grpo.remat: jax.checkpoint around each layer of the scanned loop) the backward
  pass keeps only each layer's input, [m, S, D] in the compute dtype per layer, and holds one
  layer's activations at a time while that layer is recomputed; the compiled programs then hold
  no whole compute copy of the masters (each layer's weights are cast inside the loop) and their
  logits are 3 float32 [m, T, V] buffers and one [m, S, V] in the compute dtype (fitted to the
  compiled buffer assignments, docs/tpu_plan.md "Calibration").
  """
  L, cs = c.num_layers, _itemsize(c.dtype)
  pop, model = split.pop, split.model
  rows, seq_len, completion_len = batch.rows, batch.seq_len, batch.completion_len
  m = batch.micro_batch_size
  master = master_dtype or c.dtype
  params = param_bytes(c, model, master)
  state = params + 2 * params  # masters + AdamW mu, nu (in the masters' dtype)
  local = rows // pop
  inputs = local * seq_len * (4 + 1 + 1 + 4) + 4 * local
  S, T = seq_len, completion_len
  heads = _split(c.num_kv_heads, model) * (c.num_heads // c.num_kv_heads)
  F, D, V = (_split(n, model) for n in (c.intermediate_size, c.hidden_size, c.vocab_size))
  saved = 1 if remat else L  # layers whose activations are alive at the backward's peak
  attn = saved * m * heads * S * S * (4 + cs)
  mlp = 6 * saved * m * S * F * cs
  hidden = saved * m * S * D * (2 * 4 + 5 * cs) + (L * m * S * D * cs if remat else 0)
  tied = c.tie_embeddings
  grads = param_bytes(c, model, "float32") + (_embed_bytes(c, model, "float32") if tied else 0)
  if remat:
    logits = 3 * m * T * V * 4 + m * S * V * cs
    cast = 0
  else:
    logits = m * T * V * (3 * 4 + 4 * cs)
    cast = param_bytes(c, model) + (_embed_bytes(c, model) if tied else 0)
  frozen = (2 if with_reference else 1) * local * completion_len * 4
  return Estimate(
    argument=state + inputs + (param_bytes(c, model) if with_reference else 0),
    output=state,
    alias=state,
    temp=grads + cast + attn + mlp + hidden + logits + frozen,
  )
