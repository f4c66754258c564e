"""The allowed values of the config fields that take a name, next to their defaults in
`experiments.configs.base`.

`experiments.config_check` validates with them and the runners read their meaning from here, so
each is declared once and the checker never imports a runner. Names the library owns stay in the
library: es_jax.fitness.SHAPINGS, es_jax.metrics.JS_CORRECTIONS, es_jax.noise.SPEC_PRECISIONS
(named here as es.arithmetic's values), es_jax.grpo.AGGREGATIONS, es_jax.models.PRESETS.
"""

from __future__ import annotations

from es_jax import noise

# model.source (experiments.model_io.load_model), besides "random" (model.preset's shapes with
# random weights); model.base_source takes these but "orbax".
MODEL_SOURCES = ("default", "hf", "gguf", "orbax")
MODEL_DTYPES = ("", "bfloat16", "float32", "float16")  # model.dtype; "" keeps the checkpoint's

ES_OPTIMIZERS = ("sgd", "adam")  # es.optimizer
# es.arithmetic: how a member θ + σε is formed, es_jax.noise.NoiseSpec's `precision`.
ES_ARITHMETICS = noise.SPEC_PRECISIONS
ES_LOW_RANK_VECTORS = ("full", "frozen")  # es.low_rank_vectors

# es.master_dtype and grpo.master_dtype: the dtype the trained weights are kept and updated in;
# "" = the model's dtype (model.dtype).
MASTER_DTYPES = ("float32", "")
# grpo.advantage_std -> the `std` argument of es_jax.grpo.group_advantages.
GRPO_ADVANTAGE_STD = {"population": "population", "unbiased": "unbiased", "none": None}

# sequential.order -> the methods of stage one and stage two.
SEQUENTIAL_ORDERS = {"grpo_es": ("grpo", "es"), "es_grpo": ("es", "grpo")}
SEQUENTIAL_KL_REFERENCES = ("base", "stage1")  # sequential.kl_reference

# demo.runs: name -> (method, sequential.order, es.shaping); None: the config's.
DEMO_RUNS = {
  "es": ("es", None, None),
  # ES with es_jax.fitness.coverage shaping, everything else as "es" (same noise and data order)
  "es_coverage": ("es", None, "coverage"),
  # the null control: fitness permuted across members each step (es_jax.fitness.shuffled)
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
# stage is redone with them): experiments/study_stages.py.
FAIR_STAGES = ("calibration", "pilots", "runs", "diversity")
