"""Config rules that involve several fields (`cross_checks`, called by
`experiments.schema.check.validate`): ES and GRPO settings that must agree, every model field used
by its source or refused, counts that must divide one another (population chunks) or fit (Pass@k's
k), the fields of a question/answer file task, and a report's run directories. A field no run reads
is refused rather than silently ignored, and a GRPO-only setting never blocks an ES run. Where the
library holds a rule itself it is called, not restated: the population's noise
(`es_jax.es.noise.NoiseSpec`, built by `noise_spec`) checks antithetic pairs and the arithmetic
modes' full rank."""

from __future__ import annotations

from typing import Any

from es_jax.es import noise, reference_arithmetic
from experiments import fields
from experiments.schema.errors import ConfigError, fail

# The [N]-fitness shapings (the in-place arithmetic's update takes one weight per member).
_IN_PLACE_SHAPINGS = ("zscore", "centered_rank", "shuffled")
# NoiseSpec's arguments -> the config.es fields they come from.
_SPEC_FIELDS = {
  "population_size": "population_size",
  "antithetic": "antithetic",
  "rank": "rank",
  "low_rank_vectors": "low_rank_vectors",
  "precision": "arithmetic",
}


def noise_spec(es: Any) -> noise.NoiseSpec:
  """The population's `noise.NoiseSpec` from `config.es` (rank 0 = full rank; `arithmetic` is the
  spec's precision); the spec's own refusals name the config field.

  Raises:
    ConfigError: e.g. `config.es.population_size=5 is odd but antithetic=True pairs members ...`.
  """
  try:
    return noise.NoiseSpec(
      int(es.population_size),
      antithetic=bool(es.antithetic),
      rank=int(es.rank) or None,
      low_rank_vectors=es.low_rank_vectors,
      precision=es.get("arithmetic", fields.default("es.arithmetic")),  # an older run's config
    )
  except ValueError as e:
    text = str(e)
    arg = text.partition("=")[0]
    if arg in _SPEC_FIELDS:
      raise ConfigError(f"config.es.{_SPEC_FIELDS[arg]}{text[len(arg) :]}") from e
    raise ConfigError(f"config.es: {text}") from e


def cross_checks(config: Any) -> None:
  """Rules that involve two fields or more; raises ConfigError naming the field to change. A
  partial config (a test's, a library caller's) gets the rules whose groups it has."""
  _study_checks(config)
  if not all(g in config for g in ("es", "grpo", "model", "data")):
    return
  es, grpo = config.es, config.grpo
  _es_arithmetic_checks(es)
  noise_spec(es)
  rows = int(config.data.prompts_per_step) * int(grpo.num_generations)
  if _uses_grpo(config) and grpo.mini_batch_size and rows % int(grpo.mini_batch_size):
    raise fail(
      "grpo.mini_batch_size",
      grpo.mini_batch_size,
      f"must divide the {rows} rollout rows (prompts_per_step x num_generations)",
    )
  _model_checks(config.model)
  _size_checks(config)
  _file_task_checks(config)


def _study_checks(config: Any) -> None:
  """The methods other than training: what their sections need together with the method."""
  method, report = config.get("method"), config.get("report")
  if method == "report" and report is not None:
    if not [w for w in str(report.get("workdirs") or "").split(",") if w.strip()]:
      raise ConfigError(
        "config.report.workdirs is empty: name the run directories, comma-separated."
      )
  d, model = config.get("diversity"), config.get("model")
  if method != "diversity" or d is None or model is None:
    return
  if d.get("checkpoints") and not (d.get("run") or model.get("source") == "orbax"):
    raise fail(
      "diversity.checkpoints",
      d.checkpoints,
      "needs diversity.run (an ES run dir) or config.model.source='orbax'",
    )


def _es_arithmetic_checks(es: Any) -> None:
  """es.arithmetic other than "fp32" rounds in the weights' own dtype, so the weights must be
  kept in the model's (with float32 masters it would be "fp32" in all but name); the in-place
  modes are their codes' plain ES step (full rank and no antithetic pairs: `noise_spec`)."""
  arithmetic = es.arithmetic
  if arithmetic != "fp32" and es.master_dtype != "":
    raise fail(
      "es.master_dtype",
      es.master_dtype,
      f"es.arithmetic={arithmetic!r} rounds in the weights' dtype: keep them in the model's "
      "dtype with es.master_dtype=''",
    )
  if arithmetic in reference_arithmetic.MODES:
    for field, ok, need in (
      ("optimizer", es.optimizer == "sgd", "sgd"),
      ("shaping", es.shaping in _IN_PLACE_SHAPINGS, f"one of {_IN_PLACE_SHAPINGS}"),
    ):
      if not ok:
        raise fail(f"es.{field}", es[field], f"es.arithmetic={arithmetic!r} needs {need}")


_FILE_FIELDS = ("question_field", "answer_field", "prompt_template")


def _file_task_checks(config: Any) -> None:
  """Task "file" needs its path and reward; its fields are refused for other tasks (unused)."""
  d, ev = config.data, config.get("eval")
  if d.task == "file":
    if not d.get("path"):
      raise fail("data.path", d.get("path"), "data.task='file' needs your question/answer file")
    if not d.reward:
      raise fail(
        "data.reward",
        d.reward,
        "data.task='file' needs a reward: a name of es_jax.rewards (qa = exact match, gsm8k = "
        "numeric, math, choice, code, ...) or 'module:function'",
      )
  elif d.get("path"):
    raise fail("data.path", d.path, f"only data.task='file' reads it, not {d.task!r}")
  file_in_use = d.task == "file" or (ev is not None and ev.get("task") == "file")
  for field in _FILE_FIELDS:
    unused = fields.declared()[f"data.{field}"].default
    if not file_in_use and d.get(field, unused) != unused:
      raise fail(f"data.{field}", d[field], "only a task 'file' (data or eval) uses it")
  if ev is None:
    return
  if ev.get("task") == "file" and not (ev.get("path") or d.get("path")):
    raise fail("eval.path", ev.get("path"), "eval.task='file' needs eval.path or data.path")
  if ev.get("task") == "file" and not d.reward:
    raise fail("data.reward", d.reward, "eval.task='file' scores with data.reward: name one")
  if ev.get("task") != "file" and ev.get("path"):
    raise fail("eval.path", ev.path, f"only eval.task='file' reads it, not {ev.get('task')!r}")


def _uses_grpo(config: Any) -> bool:
  """Whether the method trains with GRPO (a GRPO-only setting must not block an ES run)."""
  method = config.get("method")
  if method == "demo":
    runs = str(config.get("demo", {}).get("runs", "")).split(",")
    return any(r.strip() in ("grpo", "grpo_es", "es_grpo") for r in runs)
  return method in ("grpo", "sequential")


def _model_checks(model: Any) -> None:
  """Every model field is used by the source, or refused (never silently ignored)."""
  source = model.source
  if source == "random" and not model.preset:
    raise fail("model.preset", model.preset, "model.source='random' needs a preset")
  if source in ("hf", "gguf", "orbax") and not model.path:
    raise fail(
      "model.path", model.path, f"model.source={source!r} needs a path: your model's directory"
    )
  if source in ("default", "random") and model.path:
    raise fail(
      "model.path",
      model.path,
      f"model.source={source!r} ignores a path: set model.source=hf, gguf or orbax to load it",
    )
  if source != "random" and model.preset:
    raise fail(
      "model.preset", model.preset, f"only model.source='random' uses a preset, not {source!r}"
    )
  if source != "orbax":
    for field in ("base_path", "base_source"):
      unused = fields.declared()[f"model.{field}"].default
      if model.get(field, unused) != unused:
        raise fail(
          f"model.{field}",
          model[field],
          f"only model.source='orbax' uses it (the architecture of a checkpoint), not {source!r}",
        )


def _size_checks(config: Any) -> None:
  """Counts that must divide one another or fit (population chunks, Pass@k's k)."""
  es, ev = config.es, config.get("eval")
  chunk, pop = int(es.members_per_chunk), int(config.mesh.pop)
  per_call = chunk * max(pop, 1)
  if es.population_size % per_call:
    devices = f" x mesh.pop={pop}" if pop > 1 else ""
    raise fail(
      "es.population_size",
      es.population_size,
      f"must be divisible by es.members_per_chunk={chunk}{devices} = {per_call} (members run in "
      "chunks of that size): change one of them",
    )
  if ev is not None and "ks" in ev and "num_samples" in ev:
    too_big = [int(k) for k in ev.ks if int(k) > int(ev.num_samples)]
    if too_big:
      raise fail(
        "eval.ks",
        tuple(ev.ks),
        f"Pass@k needs k <= eval.num_samples={ev.num_samples}, but k={too_big} is larger: raise "
        "eval.num_samples or drop those k",
      )
