"""The config every experiment starts from: `base_config()`, each field at its default.

The fields (default, allowed values, help) are declared once, by group, in `experiments.fields`;
`python -m experiments.main --config FILE --help_config` lists them. The groups each method reads
are `METHOD_GROUPS`; `METHODS` is the method table (config.method -> its runner). The config files
(experiments/configs/*.py) start from `base_config()` and override values only; `smoke`,
`forgetting` and `parse_variant` are the variants they share. Sample files for offline smoke runs
live in experiments/configs/sample_data/.
"""

from __future__ import annotations

import os

import ml_collections

from experiments import fields

SAMPLE_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample_data")
METHODS = fields.METHODS  # config.method -> "module:function(config, workdir)"
METHOD_GROUPS = fields.METHOD_GROUPS  # config.method -> the groups it reads


def base_config() -> ml_collections.ConfigDict:
  """All fields with their declared defaults (the paper's where it gives one); unlocked, callers
  lock."""
  return fields.defaults()


def smoke(c: ml_collections.ConfigDict, *, preset: str, data: str | None, eval_data: str | None):
  """Turns `c` into its `:smoke` variant in place: a random `preset` model with the bundled
  tokenizer, the shipped sample files of datasets `data` / `eval_data` (None: keep the task, e.g.
  reasoning-gym), tiny sizes and one device; end to end in well under a minute on a CPU."""
  c.model.update(source="random", preset=preset, path="")
  c.data.reward = "char_parity"  # a random model scores 0 on any task: see es_jax.rewards.synthetic
  c.data.update(limit=min(c.data.limit, 24), prompts_per_step=2)
  if data:
    c.data.source_dir = sample_dir(data)
  if eval_data:
    c.eval.source_dir = sample_dir(eval_data)
  c.eval.update(
    limit=4,
    num_samples=2,
    ks=(1, 2),
    max_new_tokens=8,
    batch_size=6,
    every=2,
    periodic_limit=2,
    periodic_num_samples=2,
  )
  c.es.update(num_steps=3, population_size=4, members_per_chunk=2, max_new_tokens=8)
  c.grpo.update(
    num_steps=3, num_generations=2, max_new_tokens=8, mini_batch_size=0, micro_batch_size=2
  )
  c.sequential.update(total_steps=4)
  c.checkpoint.update(every=1, keep=2)
  c.log_samples_every = 1
  c.diversity.update(
    limit=2, num_samples=2, prompts_per_call=2, pol_prompts=1, pol_samples=2, bootstrap=200
  )
  c.population_sweep.sizes = "2,4"  # the smoke ES population is 4; N = 8..64 is not small
  c.mesh.pop = 1  # tiny batches: one device (the tests run with 8 fake CPU devices)
  return c


# The paper's held-out tasks for forgetting (docs/method.md §5, §10.2), each with the split the
# builders read (es_jax.data.builders) and that split's size in the files named there: CSQA's
# dev_rand_split.jsonl, HotpotQA's distractor dev set, GPQA-Diamond, MBPP's test task ids 11-510
# (scored by running the code in a sandboxed process, es_jax.rewards.code); Countdown's
# test.jsonl has no standard size (None: all of it). The held-out sets differ by setting
# (paper): Easy holds out all five and its average (Table 10) covers all five, MBPP included;
# Hard holds out GPQA-Diamond, MBPP, CSQA and Countdown (no HotpotQA), averaged (Table 5).
_CSQA = {"task": "csqa", "split": "validation", "limit": 1221}
_GPQA = {"task": "gpqa", "split": "diamond", "limit": 198}
_MBPP = {"task": "mbpp", "split": "test", "limit": 500}
_COUNTDOWN = {"task": "countdown", "split": "test", "limit": None}
_HOTPOTQA = {"task": "hotpotqa", "split": "validation", "limit": 7405}
HELD_OUT_TASKS = {
  "easy": (_CSQA, _HOTPOTQA, _GPQA, _MBPP, _COUNTDOWN),
  "hard": (_CSQA, _GPQA, _MBPP, _COUNTDOWN),
}


def forgetting(c: ml_collections.ConfigDict, setting: str) -> ml_collections.ConfigDict:
  """Turns `c` into its `:forgetting` variant in place: method="evaluate" of config.model on the
  held-out tasks of `setting` ("easy" or "hard", HELD_OUT_TASKS) only (no math task, so the math
  score is never mixed in), with the config's sampling settings. eval/table.md has one row per
  task; its macro row is the paper's forgetting average: all of the setting's held-out tasks."""
  first, *rest = HELD_OUT_TASKS[setting]
  c.method = "evaluate"
  c.eval.update(
    task=first["task"],
    split=first["split"],
    limit=first["limit"],
    source_dir="",
    every=0,
    extra_tasks=tuple(dict(t) for t in rest),
  )
  return c


def parse_variant(variant: str | None, *, file: str, models, modes) -> tuple[str | None, str, bool]:
  """(model, mode, smoke) of a variant "[MODEL_][MODE_][smoke]", e.g. "qwen2.5-3b_sweep",
  "forgetting", "sweep_smoke"; model None when not named. Unknown parts raise ValueError."""
  parts = variant.split("_") if variant else []
  model = parts.pop(0) if parts and parts[0] in models else None
  mode = parts.pop(0) if parts and parts[0] in modes else ""
  smoke_run = parts == ["smoke"]
  if parts and not smoke_run:
    model_part = f"MODEL one of {sorted(models)}, " if models else ""
    raise ValueError(
      f"{file}: unknown variant {variant!r}; use {'[MODEL_]' if models else ''}[MODE_][smoke] "
      f"with {model_part}MODE one of {sorted(modes)}, e.g. '{sorted(modes)[0]}'."
    )
  return model, mode, smoke_run


def sample_dir(name: str) -> str:
  """The shipped sample files of dataset `name` (experiments/configs/sample_data/<name>)."""
  return os.path.join(SAMPLE_DATA, name)
