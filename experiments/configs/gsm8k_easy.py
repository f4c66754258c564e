"""The paper's Easy setting (docs/method.md §1, §3, §5): Qwen2.5-1.5B-Instruct on GSM8K.

    python -m experiments.main --config experiments/configs/gsm8k_easy.py --workdir gs://BUCKET/es \
        --config.method=es          # or grpo | sequential (--config.sequential.order=es_grpo)
    python -m experiments.main --config experiments/configs/gsm8k_easy.py:smoke --workdir /tmp/s

Data: GSM8K's train.jsonl / test.jsonl (github.com/openai/grade-school-math) in a directory given
as --config.data.source_dir=DIR --config.eval.source_dir=DIR (prepared once into TFDS files).
Model: --config.model.path = a local HF directory of Qwen2.5-1.5B-Instruct (or the hub id when
the network allows).
Hardware: a TPU v4-8 / v5e-8 or one 80 GB GPU; the population is spread over every chip.
Expected run time: ES 234 steps (2 epochs of 7,473 problems at 64 per step) ≈ 1 day on 8 chips
(N = 32 members × 64 prompts × up to 2,048 tokens per step); GRPO the same step count in a few
hours. Expected result (paper, ×100 Pass@1/16/32 on the 1,319 test problems): base 70.3/94.8/96.4,
GRPO 78.1/93.9/95.3, ES 73.2/94.9/96.6.
`:smoke`: a random 2-layer model, the shipped GSM8K-format sample files, a few steps: under a
minute on CPU; checks the plumbing only.
"""

from experiments.configs.base import base_config, smoke


def get_config(variant: str | None = None):
  c = base_config()
  c.method = "es"
  c.model.update(source="hf", path="Qwen/Qwen2.5-1.5B-Instruct")
  c.data.update(task="gsm8k", split="train", limit=7473, prompts_per_step=64)
  c.eval.update(task="gsm8k", split="test", limit=1319, num_samples=32, temperature=0.6,
                max_new_tokens=2048, batch_size=64, ks=(1, 16, 32), every=50,
                periodic_limit=128, periodic_num_samples=4)
  # members_per_chunk=1 and eval.batch_size=64: compiled for v5e:2x4 (experiments.tpu_plan,
  # docs/tpu_plan.md), 4 members per chunk need 38.0 GiB of temporaries per chip and a 264-row
  # eval batch 27.5 GiB (16 GiB HBM); 1 member: 13.6 GiB, 64 rows: 7.9 GiB.
  c.es.update(num_steps=234, population_size=32, sigma=1.5e-3, learning_rate=2.5e-4,
              temperature=0.0, max_new_tokens=2048, members_per_chunk=1)
  c.grpo.update(num_steps=234, num_generations=8, learning_rate=1e-6, beta=0.001,
                temperature=1.0, max_new_tokens=2048, mini_batch_size=256, micro_batch_size=2,
                remat=True)
  c.sequential.update(total_steps=234, first_fraction=0.5)
  c.checkpoint.update(every=10, keep=3)
  if variant == "smoke":
    smoke(c, preset="tiny-qwen2", data="gsm8k", eval_data="gsm8k")
  elif variant:
    raise ValueError(f"gsm8k_easy.py: unknown variant {variant!r}; use no variant or ':smoke'.")
  c.lock()
  return c
