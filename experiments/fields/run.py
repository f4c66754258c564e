"""The fields of a run as a whole: the method and its runner, the seed, the model, the training
data, checkpoints, the device mesh, the decode layout, and the top-level switches."""

from __future__ import annotations

from experiments.schema.values import (
  NON_NEGATIVE,
  Field,
  Group,
  boolean,
  integer,
  mapping,
  number,
  one_of,
  one_of_registry,
  reward_or_task,
  task_name,
  text,
)


def task_source_fields() -> dict[str, Field]:
  """The fields that say where a task's rows come from, declared once for the two groups that
  read a task (`data` and `eval`); fresh `Field`s per call, one per group."""
  return {
    "task_config": Field({}, mapping, "reasoning-gym generator options ({} = the task's defaults)"),
    "data_dir": Field("", text(), "prepared TFDS data ('' = TFDS's default directory)"),
    "source_dir": Field("", text(), "downloaded original files ('' = use what data_dir holds)"),
    "on_bad_row": Field(
      "raise",
      one_of(("raise", "skip")),
      "a bad row of the source files: 'raise' (naming file and line) or 'skip'",
    ),
  }


# The one method table: config.method -> the runner "module:function(config, workdir)" that
# experiments.main calls.
METHODS = {
  "es": "experiments.runners.es_runner:run",
  "grpo": "experiments.runners.grpo_runner:run",
  "sequential": "experiments.runners.sequential:run",
  "evaluate": "experiments.evaluation.evaluate:run",
  "demo": "experiments.studies.demo:run",
  "sparsity": "experiments.studies.sparsity:run",
  "population_sweep": "experiments.studies.population_sweep:run",
  "diversity": "experiments.studies.diversity:run",
  "report": "experiments.reports.report:run",
  "calibrate": "experiments.studies.calibration:run",
  "fair_study": "experiments.studies.fair_study:run",
}

_TRAINING_GROUPS = ("model", "data", "eval", "checkpoint", "mesh", "decode")
# The config groups each method reads (the printed config shows these, plus the top-level
# fields); method="evaluate" reads `data` too when eval.task is "file" (its fields and reward).
METHOD_GROUPS = {
  "es": (*_TRAINING_GROUPS, "es"),
  "grpo": (*_TRAINING_GROUPS, "grpo"),
  "sequential": (*_TRAINING_GROUPS, "es", "grpo", "sequential"),
  "evaluate": ("model", "eval", "decode"),
  "demo": (*_TRAINING_GROUPS, "es", "grpo", "sequential", "demo"),
  "sparsity": ("model", "eval", "decode", "sparsity"),
  "population_sweep": (*_TRAINING_GROUPS, "es", "population_sweep"),
  "diversity": ("model", "eval", "es", "mesh", "decode", "diversity"),
  "report": ("report",),
  "calibrate": ("model", "data", "es", "mesh", "decode", "diversity"),
  "fair_study": (
    *_TRAINING_GROUPS,
    *("es", "grpo", "sequential", "demo", "diversity", "sparsity", "fair"),
  ),
}

METHOD = Field("es", one_of(METHODS), "the runner experiments.main calls (METHODS)")
SEED = Field(
  0, integer(0), "the run key is jax.random.key(seed); every random choice derives from it"
)
EXPORT_HF = Field(True, boolean, "write the final params as an HF directory (WORKDIR/hf)")
MAX_UPDATE_RATIO = Field(
  0.1,
  NON_NEGATIVE,
  "stop a run (one `error:` line, exit status 2) when one update changes the weights by more than "
  "this fraction of their norm, ‖Δθ‖₂/‖θ‖₂ (ES: a step; GRPO: an optimizer step); 0 = no check. "
  "The shipped configs' smoke runs reach at most 0.012 (docs/usage.md; "
  "experiments/runners/run_guard.py)",
)
PROGRESS = Field(True, boolean, "progress lines while a dataset is generated or an evaluation runs")
LOG_SAMPLES_EVERY = Field(
  10,
  integer(0),
  "write training completions every this many steps and at each stage's first and last step "
  "(0 = never) into WORKDIR/samples.jsonl and TensorBoard text (experiments/infra/samples_log.py)",
)
LOG_SAMPLES = Field(
  4,
  integer(0),
  "completions per logged step, with their rewards (ES: members from the best and worst fitness "
  "in; GRPO: rows with advantages)",
)

MODEL = Group(
  "where the weights come from (experiments.runners.model_io.load_model)",
  {
    "source": Field(
      "default",
      one_of(("default", "hf", "gguf", "orbax", "random")),
      "default (bundled SmolLM2 GGUF) | hf | gguf | orbax | random: `preset` with random weights "
      "and the bundled SmolLM2 tokenizer (for smoke runs and tests)",
    ),
    "path": Field("", text(), "source hf / gguf / orbax: your model's directory or file"),
    "base_source": Field(
      "default",
      one_of(("default", "hf", "gguf")),
      "source orbax: where the checkpoint's architecture comes from",
    ),
    "base_path": Field("", text(), "source orbax: the path of base_source"),
    "preset": Field(
      "",
      one_of_registry("es_jax.models:PRESETS", extra=("",), sort=True),
      "source random: the architecture (es_jax.models.PRESETS)",
    ),
    "dtype": Field(
      "",
      one_of(("", "bfloat16", "float32", "float16")),
      "the compute dtype; '' keeps the checkpoint's (bf16 for the paper's HF checkpoints), or "
      "bfloat16 / float32 / float16. Master weights: es.master_dtype, grpo.master_dtype",
    ),
  },
)

DATA = Group(
  "the training task: what a step's prompts are and how completions are scored",
  {
    "task": Field(
      "reasoning_gym/chain_sum",
      task_name,
      "a dataset of es_jax.data.TASKS, 'reasoning_gym/<task>', or 'file': your own "
      "question/answer file `path`",
    ),
    "path": Field(
      "",
      text(),
      "task 'file': the question/answer file (.jsonl, .json, .csv, .parquet, or a `datasets` "
      "save_to_disk split directory; es_jax.data.files)",
    ),
    "question_field": Field(
      "question", text(empty_ok=False), "task 'file': the field shown to the model"
    ),
    "answer_field": Field("answer", text(empty_ok=False), "task 'file': the gold answer's field"),
    "prompt_template": Field(
      "",
      text(),
      "task 'file': '' = the model's chat template (system prompt and answer-format instruction "
      "of the reward); else a format string over the row's fields fed as is, e.g. "
      "'Q: {question}\\nA:'",
    ),
    "split": Field("train", text(empty_ok=False), "the dataset split"),
    "limit": Field(
      256,
      integer(1, none_ok=True),
      "examples in the training pool (reasoning-gym: problems generated; None = all)",
    ),
    **task_source_fields(),
    "reward": Field(
      "",
      reward_or_task(empty_ok=True),
      "reward name ('' = the task's own, es_jax.rewards.TASK_REWARDS), or 'module:function' / "
      "'file.py:function' (completion: str, example: dict) -> float. Math tasks' own rewards read "
      "\\boxed{} answers only (the paper's); 'gsm8k_hash' / 'math_hash' also take '#### n'",
    ),
    "reward_timeout": Field(
      60.0,
      number(0.0, low_open=True),
      "seconds a user's reward (module:function) may take to import and per call (docs/usage.md)",
    ),
    "prompts_per_step": Field(8, integer(1), "P: prompts per step (the paper uses 64)"),
    "shuffle": Field(
      True, boolean, "a new permutation per epoch (a fixed function of seed and epoch)"
    ),
  },
)

CHECKPOINT = Group(
  "Orbax checkpoints: interval, how many to keep, async writes",
  {
    "every": Field(5, integer(1), "save every this many steps"),
    "keep": Field(3, integer(1), "checkpoints kept"),
    "async_save": Field(True, boolean, "write checkpoints in the background"),
  },
)

MESH = Group(
  "the device mesh",
  {
    "pop": Field(0, integer(0), "devices for the population / GRPO batch (0 = all)"),
    "model": Field(1, integer(1), "devices the weights are split over"),
    "check_memory": Field(
      True,
      boolean,
      "on TPU, refuse (before the first step) a config whose programs es_jax.devices.memory_plan "
      "predicts "
      "not to fit the chip's HBM; False skips the check",
    ),
  },
)

DECODE = Group(
  "how every decode is laid out (ES members, GRPO rollouts, evaluations, diversity). Speed only, "
  "like the mesh (a resume may change them): tokens are key-determined whatever the layout, but a "
  "sample within float rounding of a token boundary can differ (docs/benchmarks.md)",
  {
    "kv_chunk": Field(
      128,
      integer(0),
      "while the generated tokens fit in this many KV cache slots after the prompt's, a step reads "
      "only those and the prompt's (0 = the whole cache each step)",
    ),
    "compactions": Field(
      0,
      integer(0),
      "halvings of the batch as rows end, so finished rows stop costing (each compiles another "
      "copy of the step)",
    ),
  },
)
