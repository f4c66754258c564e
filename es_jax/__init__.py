"""es_jax: Evolution Strategies and GRPO post-training of language models in JAX.

The public API in one place; see each module for the equations and references.
"""

from es_jax import data, grpo, metrics, models, rewards
from es_jax.data import format_prompt, load_task
from es_jax.decode import sampling
from es_jax.decode.queue import generate_queue
from es_jax.decode.sampling import Completions, Decoding, generate, generate_members, pad_prompts
from es_jax.devices import sharding
from es_jax.devices.sharding import make_mesh
from es_jax.es import fitness, members, noise, population
from es_jax.es.fitness import centered_rank, per_prompt_zscore, shape_fitness, zscore
from es_jax.es.gradient import ESState, es_gradient, es_update_direction
from es_jax.es.members import Member, member, perturb_member
from es_jax.es.noise import (
  LowRankNoise,
  NoiseSpec,
  materialize,
  member_key,
  member_noise,
  perturb,
  sample_noise,
)
from es_jax.es.population import PopulationSettings, evaluate_population
from es_jax.grpo import update as grpo_update
from es_jax.grpo.loss import (
  group_advantages,
  grpo_loss,
  k3_kl,
  token_logprobs,
  token_logprobs_from_logits,
)
from es_jax.models import (
  ModelConfig,
  Transformer,
  get_config,
  load_default,
  load_gguf,
  load_hf,
  save_hf,
)
from es_jax.persist import checkpoint, integrity, preemption
from es_jax.persist.checkpoint import Checkpointer
from es_jax.rewards import get_reward, is_correct

__version__ = "0.1.0"
