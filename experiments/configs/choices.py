"""The tables of the config fields whose names carry a meaning the runners read (a demo run's
method, a sequential order's stages, ...): the field declarations (`experiments.fields`) take
their allowed values from here and the runners their meaning, so the checker never imports a
runner. Names the library owns stay in the library (es_jax.es.fitness.SHAPINGS, ...).
"""

from __future__ import annotations

# grpo.advantage_std -> the `std` argument of es_jax.grpo.loss.group_advantages.
GRPO_ADVANTAGE_STD = {"population": "population", "unbiased": "unbiased", "none": None}

# sequential.order -> the methods of stage one and stage two.
SEQUENTIAL_ORDERS = {"grpo_es": ("grpo", "es"), "es_grpo": ("es", "grpo")}

# demo.runs: name -> (method, sequential.order, es.shaping); None: the config's.
DEMO_RUNS = {
  "es": ("es", None, None),
  # ES with es_jax.es.fitness.coverage shaping, everything else as "es" (same noise and data order)
  "es_coverage": ("es", None, "coverage"),
  # the null control: fitness permuted across members each step (es_jax.es.fitness.shuffled)
  "es_null": ("es", None, "shuffled"),
  "grpo": ("grpo", None, None),
  "grpo_es": ("sequential", "grpo_es", None),
  "es_grpo": ("sequential", "es_grpo", None),
}

# diversity.kinds -> the label of the population kind in the study's table.
DIVERSITY_KINDS = {
  "es": "ES population",
  "group": "GRPO group (one policy)",
  "control": "ES at σ = 0",
}

# The stages of method=fair_study, in order; `fair.redo` names those to start over (each later
# stage is redone with them): experiments/studies/stages.py.
FAIR_STAGES = ("calibration", "pilots", "runs", "diversity")
