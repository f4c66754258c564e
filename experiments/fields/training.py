"""The fields of the two training methods and their schedule: `config.es` (docs/method.md §1-2),
`config.grpo` (§3) and `config.sequential` (§4)."""

from __future__ import annotations

from experiments.configs.choices import GRPO_ADVANTAGE_STD, SEQUENTIAL_ORDERS
from experiments.schema.values import (
  FRACTION,
  NON_NEGATIVE,
  POSITIVE,
  PROBABILITY,
  Field,
  Group,
  boolean,
  integer,
  one_of,
  one_of_registry,
)

# es.master_dtype and grpo.master_dtype: the dtype the trained weights are kept and updated in.
_MASTER_DTYPES = ("float32", "")

ES = Group(
  "ES hyperparameters (docs/method.md §1-2)",
  {
    "num_steps": Field(10, integer(1), "update steps"),
    "population_size": Field(32, integer(1), "N: members per step"),
    "sigma": Field(1.5e-3, POSITIVE, "σ: the scale of the member perturbations θ + σε"),
    "learning_rate": Field(2.5e-4, POSITIVE, "α; θ ← θ + (α/N) Σ z_i ε_i with optimizer 'sgd'"),
    "optimizer": Field("sgd", one_of(("sgd", "adam")), "'sgd' (the paper) | 'adam'"),
    "shaping": Field(
      "zscore",
      one_of_registry("es_jax.es.fitness:SHAPINGS", sort=True),
      "rewards to fitness weights (es_jax.es.fitness): zscore | centered_rank | per_prompt_zscore "
      "| "
      "coverage | shuffled (the null control: z-scores permuted across members each step, same "
      "drift, no signal)",
    ),
    "antithetic": Field(False, boolean, "mirrored pairs of members (2j, 2j+1) = (+ε, -ε)"),
    "rank": Field(0, integer(0), "0 = full rank; r > 0 = EGGROLL low rank r"),
    "low_rank_vectors": Field(
      "full",
      one_of_registry("es_jax.es.noise:LOW_RANK_VECTORS"),
      "'full' | 'frozen': non-matrix leaves in low rank",
    ),
    "master_dtype": Field(
      "float32",
      one_of(_MASTER_DTYPES),
      "the dtype ES keeps and updates the weights in (docs/method.md §1, 'Arithmetic modes'): "
      "'float32': members θ + σε and the update are computed in float32, members run in the "
      "model's dtype; '': the model's dtype, θ + Δ rounded once to it (updates below its "
      "resolution are lost). For a float32 model all choices compute the same",
    ),
    "arithmetic": Field(
      "fp32",
      one_of_registry("es_jax.es.noise:SPEC_PRECISIONS"),
      "how a member θ + σε is formed (es_jax.es.noise.NoiseSpec's precision): 'fp32': float32(w) + "
      "σε, rounded once to the weights' dtype; 'bf16_faithful': round(w + round(σε)); "
      "'bf16_shared_noise': Qiu et al.'s code (es_jax.es.reference_arithmetic: one bf16 noise per "
      "tensor shape, in-place perturb/restore residues, the update summed in bf16); "
      "'bf16_tensor_noise': the understanding-es reproduction's code (per-tensor fp32 noise, σε "
      "rounded once, the update summed in fp32). All but 'fp32' need master_dtype ''; the last "
      "two also optimizer 'sgd', rank 0, antithetic False and shaping zscore, centered_rank or "
      "shuffled",
    ),
    "members_per_chunk": Field(1, integer(1), "members vmapped together on a device"),
    "max_new_tokens": Field(64, integer(1), "tokens a member generates per prompt at most"),
    "temperature": Field(0.0, NON_NEGATIVE, "0 = greedy fitness (the paper's Easy setting)"),
    "top_p": Field(1.0, PROBABILITY, "nucleus sampling's p for sampled fitness"),
    "share_sample_key": Field(
      True,
      boolean,
      "sampled fitness (temperature > 0): every member draws its completions with the step's one "
      "sampling key (common random numbers: members differ by their perturbation, not by sampling "
      "luck); False gives each member its own key fold_in(key, i)",
    ),
  },
)

GRPO = Group(
  "GRPO hyperparameters (docs/method.md §3)",
  {
    "num_steps": Field(10, integer(1), "rollout steps"),
    "num_generations": Field(8, integer(2), "G: completions per prompt"),
    "learning_rate": Field(1e-6, POSITIVE, "AdamW's learning rate"),
    "weight_decay": Field(0.0, NON_NEGATIVE, "AdamW's weight decay"),
    "max_grad_norm": Field(1.0, POSITIVE, "gradient clipping by global norm"),
    "master_dtype": Field(
      "float32",
      one_of(_MASTER_DTYPES),
      "AdamW master weights and moments: 'float32' (forward/backward run in the model's dtype, as "
      "verl and TRL train bf16 models), or '' to keep the model's dtype (pure bf16 AdamW: at lr "
      "1e-6 most updates are below bf16's resolution)",
    ),
    "beta": Field(
      0.001, NON_NEGATIVE, "k3 KL weight against the base model (0 skips the reference)"
    ),
    "eps_low": Field(0.2, NON_NEGATIVE, "the ratio clip's lower ε"),
    "eps_high": Field(0.2, NON_NEGATIVE, "the ratio clip's upper ε"),
    "aggregation": Field(
      "seq_mean_token_mean",
      one_of_registry("es_jax.grpo.loss:AGGREGATIONS"),
      "how token losses are averaged (es_jax.grpo.loss.AGGREGATIONS)",
    ),
    "advantage_std": Field(
      "population",
      one_of(tuple(GRPO_ADVANTAGE_STD)),
      "'population' | 'unbiased' | 'none' (Dr.GRPO): the group std advantages are divided by",
    ),
    "mini_batch_size": Field(
      0, integer(0), "rows per optimizer step (0 = the whole rollout, one step)"
    ),
    "micro_batch_size": Field(8, integer(1), "rows per device per accumulation step"),
    "remat": Field(
      False,
      boolean,
      "recompute each layer in the backward pass (gradient checkpointing): same gradients, about "
      "one more forward pass; needed for long completions (the paper configs set it)",
    ),
    "max_new_tokens": Field(64, integer(1), "tokens a rollout generates per prompt at most"),
    "temperature": Field(1.0, POSITIVE, "the rollouts' sampling temperature"),
    "top_p": Field(1.0, PROBABILITY, "the rollouts' nucleus sampling p"),
  },
)

SEQUENTIAL = Group(
  "the two-stage schedule (docs/method.md §4)",
  {
    "order": Field("grpo_es", one_of(tuple(SEQUENTIAL_ORDERS)), "'grpo_es' | 'es_grpo'"),
    "total_steps": Field(20, integer(2), "one budget of update steps shared by the two stages"),
    "first_fraction": Field(0.5, FRACTION, "share of total_steps given to the first stage"),
    "kl_reference": Field(
      "base",
      one_of(("base", "stage1")),
      "GRPO's KL reference in ES→GRPO: 'base' (the original model, as in a GRPO-only run) or "
      "'stage1' (the ES stage's output); GRPO→ES has no KL in its second stage",
    ),
  },
)
