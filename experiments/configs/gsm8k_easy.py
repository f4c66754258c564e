"""The paper's Easy setting (docs/method.md §1, §3, §5): Qwen2.5-1.5B-Instruct on GSM8K.

    python -m experiments.main --config experiments/configs/gsm8k_easy.py --workdir gs://BUCKET/es \
        --config.method=es          # or grpo | sequential (--config.sequential.order=es_grpo)
    python -m experiments.main --config experiments/configs/gsm8k_easy.py:llama-3.2-3b \
        --workdir gs://BUCKET/llama --config.model.path=/models/Llama-3.2-3B-Instruct
    python -m experiments.main --config experiments/configs/gsm8k_easy.py:smoke --workdir /tmp/s

Data: GSM8K's train.jsonl / test.jsonl (github.com/openai/grade-school-math) in a directory given
as --config.data.source_dir=DIR --config.eval.source_dir=DIR (prepared once into TFDS files).
Model: --config.model.path = a local HF directory (config.json, *.safetensors, tokenizer files)
of the variant's model; the default path is the hub id, read as a relative local directory
(nothing is downloaded).
Hardware: a TPU v4-8 / v5e-8 or one 80 GB GPU; the population is spread over every chip.
Expected run time: ES 234 steps (2 epochs of 7,473 problems at 64 per step) ≈ 1 day on 8 chips
(N = 32 members × 64 prompts × up to 2,048 tokens per step); GRPO the same step count in a few
hours. Expected result (paper, ×100 Pass@1/16/32 on the 1,319 test problems): base 70.3/94.8/96.4,
GRPO 78.1/93.9/95.3, ES 73.2/94.9/96.6.

Variants "[MODEL_][MODE_][smoke]" (docs/method.md §10.1):
  MODEL  qwen2.5-0.5b | qwen2.5-1.5b (the default) | qwen2.5-3b | qwen2.5-7b | llama-3.2-3b: the
         Instruct model of that name (preset of the same name in es_jax.models). The paper gives
         no per-model ES settings: every model keeps the defaults N = 32, σ = 1.5e-3, α = 2.5e-4
         (and GRPO's). Reported results exist for Qwen2.5-1.5B (above) and Llama-3.2-3B (base
         77.7/96.8/98.1, GRPO 84.7/95.6/96.4, ES 81.6/96.4/97.9); none for 0.5B, 3B, 7B here.
         Larger models scale the per-step cost roughly with their size and may not fit the
         sizes above: on TPU, mesh.check_memory refuses a config predicted not to fit before
         the first step (then raise mesh.model); the 3B and 7B variants were not compiled here.
  sweep  method=population_sweep (docs/method.md §8): ES at N = 8, 16, 32, 64 for 300 updates
         (the paper compares smoothed training reward at update 300), periodic and final
         evaluation off; only for qwen2.5-0.5b / -1.5b / -3b, the models the paper sweeps.
         Four ES runs of 300 steps; a step's cost grows about linearly with N (N = 64 about
         twice one at N = 32), so the sweep costs about 3.75 × 300/234 of one default ES run.
         Expected (paper, smoothed reward at update 300, N = 8/16/32/64): 0.5B
         .442/.494/.525/.529, 1.5B .828/.839/.845/.844, 3B .890/.900/.900/.903; the smallest N
         within 0.01 of N = 64: 32 for 0.5B, 16 for 1.5B and 3B. Smoothing: a debiased EMA of
         decay 0.99 (population_sweep.ema_decay).
  forgetting  method=evaluate of config.model (a trained run's WORKDIR/hf, or the base model)
         on the held-out tasks (CSQA validation, HotpotQA validation, GPQA-diamond, MBPP test
         sandboxed, Countdown test; experiments.configs.base.HELD_OUT_TASKS["easy"]) with the
         eval settings above; eval/table.md gives one row per task (its macro row averages all
         five, MBPP included: the paper's Easy forgetting average, Table 10).
         Each task reads its own files: pass them with --config.eval.source_dir=CSQA_DIR for
         CSQA (dev_rand_split.jsonl), and for the others prepare them once into the TFDS
         data_dir (es_jax.data.load_task with source_dir) or give source_dir in
         --config.eval.extra_tasks: HotpotQA hotpot_dev_distractor_v1.json,
         GPQA gpqa_diamond.csv, MBPP mbpp.jsonl (or sanitized-mbpp.json / test.jsonl),
         Countdown test.jsonl (the paper does not say which Countdown problems it holds out).
         Cost: about 9,300 problems plus Countdown's, 33 samples each, HotpotQA's 7,405 the
         most of it (run time not measured here).
  smoke  a random 2-layer model, the shipped GSM8K-format sample files, a few steps: under a
         minute on CPU; checks the plumbing only (with sweep: N = 2, 4). Not with forgetting
         (no sample files of the held-out tasks are shipped).
"""

from experiments.configs.base import base_config, forgetting, parse_variant, smoke

# Variant name -> the model's default path (its hub id as a local directory).
MODELS = {
  "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
  "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
  "qwen2.5-3b": "Qwen/Qwen2.5-3B-Instruct",
  "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
  "llama-3.2-3b": "meta-llama/Llama-3.2-3B-Instruct",
}
DEFAULT_MODEL = "qwen2.5-1.5b"
SWEEP_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")  # docs/method.md §8
SWEEP_SIZES = "8,16,32,64"
SWEEP_STEPS = 300
MODES = ("sweep", "forgetting")


def get_config(variant: str | None = None):
  model, mode, smoke_run = parse_variant(variant, file="gsm8k_easy.py", models=MODELS, modes=MODES)
  model = model or DEFAULT_MODEL
  c = base_config()
  c.method = "es"
  c.model.update(source="hf", path=MODELS[model])
  c.data.update(task="gsm8k", split="train", limit=7473, prompts_per_step=64)
  c.eval.update(
    task="gsm8k",
    split="test",
    limit=1319,
    num_samples=32,
    temperature=0.6,
    max_new_tokens=2048,
    batch_size=64,
    ks=(1, 16, 32),
    every=50,
    periodic_limit=128,
    periodic_num_samples=4,
  )
  # members_per_chunk=1 and eval.batch_size=64: compiled for v5e:2x4 (experiments.tpu.plan,
  # docs/tpu_plan.md), 4 members per chunk need 38.0 GiB of temporaries per chip and a 264-row
  # eval batch 27.5 GiB (16 GiB HBM); 1 member: 13.6 GiB, 64 rows: 7.9 GiB.
  c.es.update(
    num_steps=234,
    population_size=32,
    sigma=1.5e-3,
    learning_rate=2.5e-4,
    temperature=0.0,
    max_new_tokens=2048,
    members_per_chunk=1,
  )
  c.grpo.update(
    num_steps=234,
    num_generations=8,
    learning_rate=1e-6,
    beta=0.001,
    temperature=1.0,
    max_new_tokens=2048,
    mini_batch_size=256,
    micro_batch_size=2,
    remat=True,
  )
  c.sequential.update(total_steps=234, first_fraction=0.5)
  c.checkpoint.update(every=10, keep=3)
  if mode == "sweep":
    if model not in SWEEP_MODELS:
      raise ValueError(f"gsm8k_easy.py:{variant}: the paper sweeps N only for {SWEEP_MODELS}.")
    c.method = "population_sweep"
    c.population_sweep.update(sizes=SWEEP_SIZES, tolerance=0.01, evaluate=False)
    c.es.num_steps = SWEEP_STEPS
    c.eval.every = 0
  elif mode == "forgetting":
    if smoke_run:
      raise ValueError("gsm8k_easy.py: no ':forgetting_smoke' (no held-out sample files).")
    forgetting(c, "easy")
  if smoke_run:
    smoke(
      c,
      preset="tiny-llama" if model.startswith("llama") else "tiny-qwen2",
      data="gsm8k",
      eval_data="gsm8k",
    )
    if mode == "sweep":
      c.population_sweep.sizes = "2,4"
      c.es.num_steps = 3
  c.lock()
  return c
