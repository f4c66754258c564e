"""A config's programs against a chip's memory, before anything loads: the sizes each program
takes from the experiment config, read into es_jax.devices.memory_plan's estimates (`predict`), and
the refusal that names the config field to lower (`check_config_fits`; the runners call it through
`run_context.check_memory`, the planner compares it with the compiled figures).
"""

from __future__ import annotations

from typing import Any

from es_jax.devices.memory_plan import (
  GIB,
  PROMPT_LEN,
  Chip,
  Estimate,
  Split,
  TokenBatch,
  es_update_estimate,
  generate_estimate,
  grpo_update_estimate,
  population_estimate,
)
from es_jax.models.config import ModelConfig
from experiments import fields

# Programs each experiment method runs (experiments.tpu.plan compiles the same).
METHOD_PROGRAMS = {
  "es": ("es_population", "es_update", "eval"),
  "grpo": ("grpo_rollout", "grpo_update", "eval"),
}
METHOD_PROGRAMS["sequential"] = METHOD_PROGRAMS["demo"] = (
  METHOD_PROGRAMS["es"] + METHOD_PROGRAMS["grpo"][:2]
)


def check_fits(estimate: Estimate, chip: Chip, *, program: str, setting: str) -> None:
  """Raises ValueError naming `setting` and the limit when `estimate` exceeds the chip's HBM."""
  if estimate.total > chip.hbm_bytes:
    raise ValueError(
      f"{program} needs about {estimate.total / GIB:.1f} GiB per chip (predicted by "
      f"es_jax.devices.memory_plan) but a {chip.name} has {chip.hbm_bytes / GIB:.1f} GiB: "
      f"lower {setting} (or set config.mesh.check_memory=False to run anyway)."
    )


def predict(
  program: str,
  config: Any,
  model_config: ModelConfig,
  *,
  pop: int,
  model: int,
  prompt_len: int,
  chip: str = "",
) -> Estimate:
  """The `Estimate` of one of experiments.tpu.plan's programs for an experiment config (`chip`:
  a CHIPS key, for the chip-dependent terms)."""
  c, es, grpo, ev = model_config, config.es, config.grpo, config.eval
  prompts = int(config.data.prompts_per_step)
  rows = prompts * int(grpo.num_generations)
  master = str(grpo.get("master_dtype", fields.default("grpo.master_dtype")) or "") or None
  split = Split(pop, model)
  if program == "es_population":
    return population_estimate(
      c,
      population_size=int(es.population_size),
      members_per_chunk=int(es.members_per_chunk),
      num_prompts=prompts,
      prompt_len=prompt_len,
      max_new_tokens=int(es.max_new_tokens),
      rank=int(es.rank) or None,
      split=split,
    )
  if program == "es_update":
    return es_update_estimate(
      c, population_size=int(es.population_size), optimizer=es.optimizer, split=split, chip=chip
    )
  if program == "eval":  # one chip, rows unsplit (as experiments.evaluation.sampler runs it)
    return generate_estimate(
      c, rows=int(ev.batch_size), prompt_len=prompt_len, max_new_tokens=int(ev.max_new_tokens)
    )
  if program == "grpo_rollout":
    return generate_estimate(
      c,
      rows=rows,
      prompt_len=prompt_len,
      max_new_tokens=int(grpo.max_new_tokens),
      split=split,
      param_dtype=master,
    )
  if program == "grpo_update":
    T = int(grpo.max_new_tokens)
    return grpo_update_estimate(
      c,
      TokenBatch(rows, prompt_len + T, T, int(grpo.micro_batch_size)),
      with_reference=float(grpo.beta) > 0,
      split=split,
      master_dtype=master,
      remat=bool(grpo.get("remat", fields.default("grpo.remat"))),
    )
  raise ValueError(f"memory_check.predict: unknown program {program!r}")


# The config field that shrinks each program (named in check_fits' errors).
SETTINGS = {
  "es_population": "config.es.members_per_chunk",
  "es_update": "config.mesh.model",
  "eval": "config.eval.batch_size",
  "grpo_rollout": "config.data.prompts_per_step",
  # The update's state (float32 masters, two moments) only shrinks by sharding it.
  "grpo_update": "config.grpo.micro_batch_size or raise config.mesh.model (mesh.pop with it)",
}


def check_config_fits(
  config: Any,
  model_config: ModelConfig,
  chip: Chip,
  *,
  programs: tuple[str, ...],
  pop: int,
  model: int = 1,
  prompt_len: int = PROMPT_LEN,
) -> None:
  """Raises ValueError naming the config field of the first program predicted not to fit."""
  for program in programs:
    estimate = predict(
      program, config, model_config, pop=pop, model=model, prompt_len=prompt_len, chip=chip.kind
    )
    check_fits(estimate, chip, program=program, setting=SETTINGS[program])
