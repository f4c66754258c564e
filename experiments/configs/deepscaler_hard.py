"""The paper's Hard setting (docs/method.md §1, §5, §9): R1-Distill-Qwen-1.5B on DeepScaleR.

    python -m experiments.main --config experiments/configs/deepscaler_hard.py \
        --workdir gs://BUCKET/hard --config.method=sequential --config.sequential.order=es_grpo
    python -m experiments.main --config experiments/configs/deepscaler_hard.py:forgetting \
        --workdir gs://BUCKET/hard_forgetting --config.model.path=gs://BUCKET/hard/hf
    python -m experiments.main --config experiments/configs/deepscaler_hard.py:smoke \
        --workdir /tmp/s

Data: DeepScaleR-Preview's deepscaler.json (--config.data.source_dir=DIR) for training. The
final evaluation is the paper's math average: MATH-500 (eval.task; its test.jsonl in
--config.eval.source_dir=DIR) and the extra tasks AIME24 (30 problems), AIME25 (30) and AMC23
(40), macro-averaged in eval/table.md. The extra tasks have no source_dir here: prepare each once
into the TFDS data_dir (es_jax.data.load_task(name, "test", files=DataFiles(data_dir, DIR))), or
give the entries with source_dir in --config.eval.extra_tasks. Expected files
(es_jax.data.builders): AIME24 test.jsonl / aime24.jsonl / *.parquet (e.g.
HuggingFaceH4/aime_2024); AIME25 test.jsonl / aime25.jsonl / aime2025*.jsonl
(opencompass/AIME2025); AMC23 the 40-problem set (math-ai/amc23, test.jsonl or *.parquet).
AI-MO/aimo-validation-amc has 83 problems, not AMC23's 40: with it the limit of 40 would keep its
first 40, a different set; do not use it for this table. Periodic evaluations use MATH-500 alone.
Model: --config.model.path = a local HF directory of DeepSeek-R1-Distill-Qwen-1.5B (the default
is the hub id read as a relative local directory; nothing is downloaded). The paper runs the Hard
setting on this model only, with the default ES settings (N = 32, σ = 1.5e-3, α = 2.5e-4).
Hardware: a TPU v4-32 / v5e-32 pod slice or 8 × 80 GB GPUs (8,192-token rollouts).
Steps: 630 updates for ES, GRPO and the sequential schedules alike (315 per stage), one epoch of
DeepScaleR-Preview's 40,315 problems at 64 prompts per step (630 × 64 = 40,320: the last step
takes 5 prompts of the next epoch's permutation).
Expected run time: not measured. The planner's roofline (docs/tpu_plan.md, "Hard ES on v5p") puts
an ES step at about 16 minutes on 8 v5p chips (4 members per chip), so 630 steps take about a
week there at peak bandwidth, about two days on 32 chips (one member each); GRPO faster per step.
Expected result (paper, ×100 Pass@1/16/32, math average): base 47.7/73.5/77.4, GRPO 52.9/74.7/78.0,
ES 49.9/75.0/78.9, ES→GRPO 52.3/75.8/79.2, GRPO→ES 51.6/76.2/78.2. The paper's GRPO row is a
released discrete-token GRPO checkpoint of SofT-GRPO (arXiv 2511.06411, App. D.1; the paper gives
no hub name), not a run of this config: evaluate one with --config.method=evaluate
--config.model.path=HF_DIR (docs/method.md §9 gives the command).
`:forgetting`: method=evaluate of config.model (a trained run's WORKDIR/hf, or the base model) on
the Hard held-out tasks only (CSQA validation, GPQA-diamond, MBPP test run sandboxed, Countdown
test; no HotpotQA, as the paper's Table 5; experiments.configs.base.HELD_OUT_TASKS["hard"]), never
averaged with the math tasks: one row per task in eval/table.md; its macro row averages all four,
the paper's Hard forgetting average. Files
as in gsm8k_easy.py's header (CSQA in --config.eval.source_dir, the others prepared once into the
TFDS data_dir). 8,192 new tokens × 33 samples × about 1,900 problems plus Countdown's: run time
not measured here.
`:smoke`: a random 2-layer model, the shipped DeepScaleR / MATH-500 format samples (no extra
tasks), a few steps: under a minute on CPU; checks the plumbing only.
"""

from experiments.configs.base import base_config, forgetting, parse_variant, smoke

# One epoch of DeepScaleR-Preview (40,315 problems) at 64 prompts per step: ceil(40315 / 64).
HARD_STEPS = 630

# The math average's tasks besides MATH-500 (docs/method.md §5, §10): all of each test split.
MATH_EXTRA_TASKS = (
  {"task": "aime24", "split": "test", "limit": 30},
  {"task": "aime25", "split": "test", "limit": 30},
  {"task": "amc23", "split": "test", "limit": 40},
)


def get_config(variant: str | None = None):
  _, mode, smoke_run = parse_variant(
    variant, file="deepscaler_hard.py", models=(), modes=("forgetting",)
  )
  if mode and smoke_run:
    raise ValueError("deepscaler_hard.py: no ':forgetting_smoke' (no held-out sample files).")
  c = base_config()
  c.method = "es"
  c.model.update(source="hf", path="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
  c.data.update(task="deepscaler", split="train", limit=40315, prompts_per_step=64)
  c.eval.update(
    task="math500",
    split="test",
    limit=500,
    num_samples=32,
    temperature=0.6,
    max_new_tokens=8192,
    batch_size=64,
    ks=(1, 16, 32),
    every=50,
    periodic_limit=64,
    periodic_num_samples=4,
    extra_tasks=tuple(dict(t) for t in MATH_EXTRA_TASKS),
  )
  # eval.batch_size=64: 64 rows x (256 + 8192) tokens compile to 32.4 GiB per v5p chip; 264 rows
  # needed 123 GiB (docs/tpu_plan.md).
  # Hard: sampled fitness at temperature 0.6 (docs/method.md §1).
  c.es.update(
    num_steps=HARD_STEPS,
    population_size=32,
    sigma=1.5e-3,
    learning_rate=2.5e-4,
    temperature=0.6,
    max_new_tokens=8192,
    members_per_chunk=1,
  )
  # members_per_chunk=1: one member decodes at a time per chip (40 GiB per v5p chip at 8192 tokens).
  c.grpo.update(
    num_steps=HARD_STEPS,
    num_generations=8,
    learning_rate=1e-6,
    beta=0.001,
    temperature=1.0,
    max_new_tokens=8192,
    mini_batch_size=256,
    micro_batch_size=1,
    remat=True,
  )
  # grpo.remat: the update of 8448-token rows compiles to 36.9 GiB per v5p chip with it, 192 GiB
  # of saved attention scores without (docs/tpu_plan.md).
  c.sequential.update(total_steps=HARD_STEPS, first_fraction=0.5)
  c.checkpoint.update(every=5, keep=3)
  if mode == "forgetting":
    forgetting(c, "hard")
  if smoke_run:
    smoke(c, preset="tiny-llama", data="deepscaler", eval_data="math500")
    c.eval.extra_tasks = ()  # no shipped AIME / AMC samples
  c.lock()
  return c
