"""The ES and GRPO steps tests/multihost_test.py takes in one process and in two (shared by the
test and tests/multihost_worker.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec
from tiny_models import micro_config, random_params

from es_jax.decode import sampling
from es_jax.es import gradient as es
from es_jax.es import noise, population
from es_jax.grpo import update as grpo_update

CONFIG = micro_config(num_layers=1, max_position_embeddings=32)
N, SIGMA, ALPHA = 8, 0.1, 0.5


def params(seed: int = 0):
  return random_params(CONFIG, seed, xp=np)


def low_half(tokens, mask):
  """Reward: the fraction of generated tokens in the lower half of the vocabulary."""
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  return ((tokens < CONFIG.vocab_size // 2) & mask).sum(-1) / np.maximum(mask.sum(-1), 1)


def flat(tree, prefix: str = "") -> dict[str, np.ndarray]:
  """``{prefix + path: value}`` of a pytree of replicated arrays (readable on every process)."""
  return {
    prefix + jax.tree_util.keystr(k): np.asarray(
      v.addressable_shards[0].data if isinstance(v, jax.Array) else v
    )
    for k, v in jax.tree_util.tree_leaves_with_path(tree)
  }


def es_step(mesh, calls: list) -> dict[str, np.ndarray]:
  """evaluate + es_gradient/sgd; `calls` collects the members this process scored."""
  p = jax.device_put(params(), NamedSharding(mesh, PartitionSpec()))  # replicated
  ids = np.random.RandomState(3).randint(0, CONFIG.vocab_size, (2, 4)).astype(np.int32)
  step_key = jax.random.key(5)

  def score(tokens, mask):
    calls.append(len(calls))
    return low_half(tokens, mask)

  spec = noise.NoiseSpec(N)
  fitness, stats = population.evaluate_population(
    p,
    ids,
    np.ones_like(ids, bool),
    settings=population.PopulationSettings(spec, SIGMA, CONFIG, mesh=mesh),
    decoding=sampling.Decoding(3),
    step_key=step_key,
    score_fn=score,
  )
  opt = optax.chain(es.es_gradient(spec), optax.sgd(ALPHA))
  apply = jax.jit(
    lambda p, s, f: optax.apply_updates(p, opt.update(p, s, p, fitness=f, key=step_key)[0])
  )
  new = apply(p, opt.init(p), jnp.asarray(fitness))
  return {**flat(new, "es/"), "es_fitness": fitness, "es_members": stats.local_members}


def grpo_step(mesh, allgather=None) -> dict[str, np.ndarray]:
  """rollout (rows over 'pop') → rewards on the host → update_step."""
  p0 = params()
  ids = np.random.RandomState(4).randint(0, CONFIG.vocab_size, (4, 4)).astype(np.int32)
  mask = np.ones_like(ids, bool)
  opt = optax.sgd(0.5)
  state = grpo_update.init_state(p0, opt, mesh=mesh)
  completions, batch = grpo_update.rollout(
    state.params,
    ids,
    mask,
    config=CONFIG,
    key=jax.random.key(2),
    num_generations=4,
    decoding=sampling.Decoding(4, temperature=1.0),
    mesh=mesh,
  )
  tokens, cmask = completions.tokens, completions.mask
  if allgather is not None:  # rows live on both processes: every host needs all of them
    tokens, cmask = allgather(tokens, tiled=True), allgather(cmask, tiled=True)
  rewards = low_half(tokens, cmask).reshape(4, 4).astype(np.float32)
  batch, _ = grpo_update.with_advantages(batch, rewards)
  ref = grpo_update.replicate(p0, mesh) if mesh is not None else p0
  settings = grpo_update.UpdateSettings(8, 1, grpo_update.LossSettings(beta=0.1))
  new, _ = grpo_update.update_step(
    state, batch, ref, settings, config=CONFIG, optimizer=opt, mesh=mesh
  )
  return {**flat(new.params, "grpo/"), "grpo_rewards": rewards}
