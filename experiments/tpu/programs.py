"""The programs `experiments.tpu.plan` compiles, lowered from abstract inputs on a TPU topology.

Each builder returns the `jax.stages.Lowered` of the program the runner executes, built from
`jax.ShapeDtypeStruct`s laid out as the runner lays out its arrays: parameters with
`es_jax.devices.sharding.param_shardings` on the ('pop', 'model') mesh, prompts replicated, GRPO
rows over
'pop'. Evaluation runs as `experiments.evaluation.sampler` runs it: on one chip, rows unsplit.

Per-step figures come from a second, one-step program: the same decode with a 1-token prompt and
the same cache length (prompt + budget), whose cost is two decode steps (the 1-token prefill is a
decode step); XLA's cost analysis counts a loop body once, so the full program's cost is not a
per-token figure. For the updates the cost is one trip of their loop (ES: one member's noise;
GRPO: one micro-batch), reported with the trip count.

The config, its model's ModelConfig and the topology's mesh come from `experiments.tpu.target`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax import models
from es_jax.decode import sampling
from es_jax.devices import memory_plan
from es_jax.devices import sharding as sharding_lib
from es_jax.es import fitness as fitness_lib
from es_jax.es import members, population
from experiments.tpu.target import (  # load_config: tpu_plan, benchmarks, tests read it here
  load_config,  # noqa: F401
  make_mesh,
  model_config_for,
  topology_devices,
)

P = PartitionSpec
FIT_SETTINGS = {"es_population": "es.members_per_chunk", "grpo_update": "grpo.micro_batch_size"}


def _sds(shape, dtype, mesh, spec=None):
  return jax.ShapeDtypeStruct(
    tuple(shape), jnp.dtype(dtype), sharding=NamedSharding(mesh, spec or P())
  )


def _key(mesh, shape=()):
  key_dtype = jax.eval_shape(lambda: jax.random.key(0)).dtype
  return jax.ShapeDtypeStruct(shape, key_dtype, sharding=NamedSharding(mesh, P()))


def abstract_params(cfg: models.ModelConfig, mesh: Mesh, lead: tuple[int, ...] = (), dtype=None):
  """Parameter structs in the model's dtype (or `dtype`), laid out as
  es_jax.devices.sharding.param_shardings does."""
  model = mesh.shape["model"]
  dtype = dtype or cfg.jnp_dtype

  def leaf(shape):
    spec = sharding_lib.leaf_spec(shape, model)
    return _sds((*lead, *shape), dtype, mesh, P(*([None] * len(lead)), *spec))

  return jax.tree.map(leaf, models.param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))


def like_params(tree, mesh: Mesh):
  """Structs of an eval_shape'd tree (optimizer state), laid out by shape like the params."""
  model = mesh.shape["model"]

  def leaf(x):
    return _sds(x.shape, x.dtype, mesh, sharding_lib.leaf_spec(x.shape, model))

  return jax.tree.map(leaf, tree)


def figures(compiled) -> dict[str, Any]:
  """Bytes per chip (memory_analysis) and cost (cost_analysis) of a compiled program."""
  m = compiled.memory_analysis()
  out = dict(
    argument=int(m.argument_size_in_bytes),
    output=int(m.output_size_in_bytes),
    alias=int(m.alias_size_in_bytes),
    temp=int(m.temp_size_in_bytes),
    code=int(m.generated_code_size_in_bytes),
  )
  # Donated (aliased) inputs share their buffers with outputs: count them once.
  out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["code"]
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  out["flops"] = float(cost.get("flops", 0.0))
  out["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
  return out


def _first_line(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return (text[0] if text else type(e).__name__)[:300]


@dataclasses.dataclass
class Setup:
  """A config's model, mesh and sizes on a topology; compiles its programs by name."""

  config: Any
  topology: str
  devices: list[Any]
  mesh: Mesh
  model_config: models.ModelConfig
  prompt_len: int

  @classmethod
  def from_config(cls, config, topology, *, preset="", dtype="", prompt_len=256):
    devices = topology_devices(topology)
    pop = int(config.mesh.pop) or len(devices) // int(config.mesh.model)
    mesh = make_mesh(devices, pop, int(config.mesh.model))
    cfg = model_config_for(config.model, preset=preset, dtype=dtype)
    if prompt_len < 1:
      raise ValueError(f"--prompt_len={prompt_len} must be >= 1")
    return cls(config, topology, devices, mesh, cfg, int(prompt_len))

  @property
  def pop(self) -> int:
    return self.mesh.shape["pop"]

  def compile(self, name: str, *, step_cost: bool = True) -> dict[str, Any]:
    """Compiles program `name`; a failed compile is reported in the result, not raised."""
    build = getattr(self, f"_{name}")
    result: dict[str, Any] = {"program": name, "settings": self.settings(name)}
    try:
      lowered, step, trips = build()
      result.update(figures(lowered.compile()))
    except Exception as e:  # noqa: BLE001 (report the failure of one program, go on)
      message = _first_line(e)
      result.update(error=message, too_big="RESOURCE_EXHAUSTED" in str(e))
      # "... HLO temporaries (38.01G) exceeds available HBM (15.75G)": keep the figures.
      m = re.search(r"temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", message)
      if m:
        result.update(temp=int(float(m[1]) * 2**30), available=int(float(m[2]) * 2**30))
      return result
    chip = memory_plan.chip_for(self.topology)
    result["step"] = {"trips": trips}
    try:
      if step is not None and step_cost:
        f = figures(step().compile())
        flops, nbytes = f["flops"] / 2, f["bytes_accessed"] / 2
      else:
        flops, nbytes = result["flops"], result["bytes_accessed"]
      seconds = max(flops / chip.peak_flops, nbytes / chip.hbm_bandwidth)
      result["step"].update(flops=flops, bytes=nbytes, seconds=seconds)
    except Exception as e:  # noqa: BLE001
      result["step"]["error"] = _first_line(e)
    return result

  def settings(self, name: str) -> dict[str, Any]:
    c = self.config
    es, grpo, ev = c.es, c.grpo, c.eval
    common = dict(topology=self.topology, pop=self.pop, model=self.mesh.shape["model"])
    common.update(dtype=self.model_config.dtype, prompt_len=self.prompt_len)
    per = {
      "es_population": dict(
        population_size=es.population_size,
        members_per_chunk=es.members_per_chunk,
        rank=es.rank,
        prompts=c.data.prompts_per_step,
        max_new_tokens=es.max_new_tokens,
      ),
      "es_update": dict(population_size=es.population_size, optimizer=es.optimizer),
      "eval": dict(batch_size=ev.batch_size, max_new_tokens=ev.max_new_tokens),
      "grpo_rollout": dict(rows=self._grpo_rows(), max_new_tokens=grpo.max_new_tokens),
      "grpo_update": dict(
        rows=self._grpo_rows(),
        mini_batch_size=self._grpo_mini(),
        micro_batch_size=grpo.micro_batch_size,
        beta=grpo.beta,
      ),
    }
    return {**common, **per[name]}

  def fit(self, name: str, chip: memory_plan.Chip, *, step_cost=True) -> dict[str, Any] | None:
    """The result at the largest value of the program's FIT_SETTINGS field whose verdict is
    "fits" (compiled, and arguments + outputs + temporaries + code within nominal HBM; a "fits
    (tight)" setting is not chosen)."""
    section, field = FIT_SETTINGS[name].split(".")
    if name == "es_population":
      limit = int(self.config.es.population_size) // self.pop
    else:
      limit = self._grpo_mini() // self.pop
    candidates = [d for d in range(limit, 0, -1) if limit % d == 0]
    original, best = self.config[section][field], None
    lo, hi = 0, len(candidates) - 1  # candidates descend: fits is monotone along the list
    try:
      while lo <= hi:
        mid = (lo + hi) // 2
        self.config[section][field] = candidates[mid]
        result = self.compile(name, step_cost=False)
        ok = not result.get("error") and result["total"] <= chip.hbm_bytes
        if ok:
          best, hi = candidates[mid], mid - 1
        else:
          lo = mid + 1
      if best is None:
        return None
      self.config[section][field] = best
      result = self.compile(name, step_cost=step_cost)
      result["fit"] = {FIT_SETTINGS[name]: best}
      return result
    finally:
      self.config[section][field] = original

  # --- programs: (lowered, one-step lowering or None, trips of the per-step figure) ---

  def _prompts(self, mesh, rows, length, spec=None):
    return _sds((rows, length), jnp.int32, mesh, spec), _sds((rows, length), bool, mesh, spec)

  def _es_population(self):
    c, cfg, mesh = self.config.es, self.model_config, self.mesh
    n, m, T = int(c.population_size), int(c.members_per_chunk), int(c.max_new_tokens)
    if n % (self.pop * m):
      raise ValueError(
        f"config.es.population_size={n} must be divisible by mesh pop={self.pop} x "
        f"es.members_per_chunk={m}"
      )
    from experiments.runners import es_runner as es_run  # the runners' dependencies: only when used

    spec = es_run.noise_spec(c)  # the spec the ES runner evaluates with
    P_ = int(self.config.data.prompts_per_step)
    scalar = _sds((), jnp.float32, mesh)
    # The runner's decode settings, with abstract temperature and top-p (what it traces), in the
    # dense layout: config.decode is not planned (every step of these programs reads the whole
    # cache, an upper bound on the chunked reads).
    decoding = jax.tree.map(lambda _: scalar, es_run.decoding(c, (cfg.vocab_size - 1,), 0))
    settings = es_run.population_settings(c, spec, cfg, mesh)
    settings = jax.tree.map(lambda _: scalar, settings)  # σ abstract, as the runner traces it
    args = (abstract_params(cfg, mesh), *self._prompts(mesh, P_, self.prompt_len))
    args += (_key(mesh), _key(mesh), decoding, settings)
    lowered = population.population_completions.lower(*args)
    return lowered, lambda: self._members_step(m, P_, T, spec), (T * n) // (self.pop * m)

  def _members_step(self, m, num_prompts, T, spec):
    """One chunk's decode on one 'pop' slot (the model axis kept), 1-token prompts: the chunk's
    members as the population batches them (`population.batch_members`)."""
    cfg = self.model_config
    mesh = make_mesh(self.devices, 1, self.mesh.shape["model"])
    own = members.member_owned_leaves(abstract_params(cfg, mesh), spec)
    if spec.rank is None:
      owned = members.Member(abstract_params(cfg, mesh, (m,)))
    else:
      base = abstract_params(cfg, mesh)
      p_i, d_i, _ = jax.eval_shape(
        lambda p: members.member(p, jax.random.key(0), 0, 1.0, spec), base
      )
      stacked = lambda x: _sds((m, *x.shape), x.dtype, mesh)  # noqa: E731
      leaves = [stacked(x) for x, o in zip(jax.tree.leaves(p_i), own, strict=True) if o]
      owned = members.Member(leaves, jax.tree.map(stacked, d_i), _sds((m,), jnp.float32, mesh))
    decoding = sampling.Decoding(
      self.prompt_len + T - 1,
      1.0,  # sampled: the temperature is an argument (traced), as in the runner
      eos_ids=(cfg.vocab_size - 1,),
      unroll_layers=sampling.default_unroll_layers(mesh),
    )

    def step(base, owned, ids, mask, keys, decoding):
      weights, axes = population.batch_members(base, owned, own, 0)
      return sampling.generate_members(weights, axes, ids, mask, decoding, keys=keys, config=cfg)

    ids, mask = self._prompts(mesh, num_prompts, 1)
    decoding = jax.tree.map(lambda _: _sds((), jnp.float32, mesh), decoding)
    base = None if spec.rank is None else abstract_params(cfg, mesh)  # low rank's shared leaves
    return jax.jit(step).lower(base, owned, ids, mask, _key(mesh, (m,)), decoding)

  def _es_update(self):
    from experiments.runners import es_runner as es_run  # the runners' dependencies: only when used

    c, mesh = self.config.es, self.mesh
    rule = es_run.make_update_rule(c)
    params = abstract_params(self.model_config, mesh)
    state = {
      "params": params,
      "opt_state": like_params(jax.eval_shape(rule(float(c.learning_rate)).init, params), mesh),
    }
    n = int(c.population_size)
    per_prompt = fitness_lib.is_per_prompt(c.shaping)
    shape = (n, int(self.config.data.prompts_per_step)) if per_prompt else (n,)
    scalar = _sds((), jnp.float32, mesh)
    fitness, sizes = _sds(shape, jnp.float32, mesh), es_run.StepSizes(scalar, scalar)
    lowered = es_run._apply.lower(state, fitness, _key(mesh), sizes, rule=rule)
    return lowered, None, n

  def _generate_lowered(self, mesh, rows, spec, length, T, temperature, top_p, **kw):
    """`sampling.generate` lowered for `rows` prompts; `kw`: `dtype` of the params, and
    `prefill_rows` (the distinct prompts prefilled once each, as the GRPO rollout does)."""
    cfg = self.model_config
    temperature = float(temperature)

    decoding = sampling.Decoding(
      T,
      temperature,
      None if top_p >= 1.0 else float(top_p),
      eos_ids=(cfg.vocab_size - 1,),
      unroll_layers=sampling.default_unroll_layers(mesh),
      prefill_rows=kw.get("prefill_rows"),
    )

    def run(params, ids, mask, key):
      return sampling.generate(params, ids, mask, decoding, key=key, config=cfg)

    ids, mask = self._prompts(mesh, rows, length, spec)
    params = abstract_params(cfg, mesh, dtype=kw.get("dtype"))
    return jax.jit(run).lower(params, ids, mask, _key(mesh))

  def _eval(self):
    ev = self.config.eval
    mesh = make_mesh(self.devices, 1, 1)  # eval_sampler: one chip, rows unsplit (module doc)
    rows, T, S = int(ev.batch_size), int(ev.max_new_tokens), self.prompt_len
    gen = lambda S_, T_: self._generate_lowered(mesh, rows, P(), S_, T_, ev.temperature, ev.top_p)  # noqa: E731
    return gen(S, T), lambda: gen(1, S + T - 1), T

  def _grpo_rows(self) -> int:
    return int(self.config.data.prompts_per_step) * int(self.config.grpo.num_generations)

  def _grpo_mini(self) -> int:
    return int(self.config.grpo.mini_batch_size) or self._grpo_rows()

  def _grpo_rollout(self):
    """grpo_rollout.rollout's decode: it device_puts the P·G repeated rows over 'pop', then calls
    the jitted generate, so the rows arrive sharded. (Lowering rollout itself under one jit turns
    that device_put into a constraint that XLA does not carry to the KV cache: 50.6 GiB of
    temporaries per chip for the Easy config against 7.9 GiB with sharded inputs.) The params are
    the GRPO state's master weights (grpo.master_dtype), cast once inside generate; each of the
    P prompts is prefilled once for its G rows (Decoding.prefill_rows), as the rollout does."""
    g = self.config.grpo
    rows, S, T = self._grpo_rows(), self.prompt_len, int(g.max_new_tokens)
    kw = {"dtype": g.master_dtype or None, "prefill_rows": int(self.config.data.prompts_per_step)}
    gen = lambda S_, T_: self._generate_lowered(  # noqa: E731
      self.mesh, rows, P("pop"), S_, T_, g.temperature, g.top_p, **kw
    )
    return gen(S, T), lambda: gen(1, S + T - 1), T

  def _grpo_update(self):
    from es_jax.grpo import rollout as grpo_rollout
    from es_jax.grpo import update as grpo_update
    from experiments.runners import grpo_runner as grpo_run

    g, cfg, mesh = self.config.grpo, self.model_config, self.mesh
    rows, T = self._grpo_rows(), int(g.max_new_tokens)
    S = self.prompt_len + T
    mini, micro = self._grpo_mini(), int(g.micro_batch_size)
    for field, size, d, what in (
      ("grpo.mini_batch_size", rows, mini, "rollout rows"),
      ("grpo.micro_batch_size", mini, micro * self.pop, "mini-batch rows / pop devices"),
    ):
      if size % d:
        raise ValueError(f"config.{field}: {d} does not divide the {size} {what}")
    optimizer = grpo_run.make_optimizer(g)
    # The state's params are master weights in grpo.master_dtype (grpo_update.init_state, as
    # experiments.runners.grpo_runner builds it); the reference policy keeps the model's dtype.
    params = abstract_params(cfg, mesh, dtype=g.master_dtype or None)
    opt = like_params(jax.eval_shape(optimizer.init, params), mesh)
    state = grpo_update.GRPOState(params, opt, _sds((), jnp.int32, mesh))
    row = lambda *shape, dtype: _sds((rows, *shape), dtype, mesh, P("pop"))  # noqa: E731
    batch = grpo_rollout.GRPOBatch(
      tokens=row(S, dtype=jnp.int32),
      mask=row(S, dtype=bool),
      loss_mask=row(S - 1, dtype=bool),
      sampler_logp=row(S - 1, dtype=jnp.float32),
      advantages=row(dtype=jnp.float32),
      completion_length=T,
    )
    ref = abstract_params(cfg, mesh) if float(g.beta) > 0 else None
    scalar = _sds((), jnp.float32, mesh)
    settings = jax.tree.map(lambda _: scalar, grpo_run.update_settings(self.config))
    lowered = grpo_update._update_step.lower(
      state,
      batch,
      ref,
      settings,
      config=cfg,
      optimizer=optimizer,
      mesh=mesh,
      state_shardings=grpo_update.state_shardings(state),
    )
    return lowered, None, (rows // mini) * (mini // (micro * self.pop))
