"""The paper's Hard setting (docs/method.md §1, §5, §9): R1-Distill-Qwen-1.5B on DeepScaleR.

    python -m experiments.main --config experiments/configs/deepscaler_hard.py \
        --workdir gs://BUCKET/hard --config.method=sequential --config.sequential.order=es_grpo
    python -m experiments.main --config experiments/configs/deepscaler_hard.py:smoke \
        --workdir /tmp/s

Data: DeepScaleR-Preview's deepscaler.json (--config.data.source_dir=DIR) for training, MATH-500's
test.jsonl (--config.eval.source_dir=DIR) for evaluation. The paper's math average also covers
AIME24/25 and AMC23: add them to the final evaluation (macro average in eval/table.md) with
--config.eval.extra_tasks="({'task': 'aime24', 'source_dir': 'DIR'}, ...)", or once prepared in
the TFDS data_dir, by name: "('aime24', 'aime25', 'amc23')"; held-out tasks (CSQA, ...) likewise.
Model: --config.model.path = a local HF directory of DeepSeek-R1-Distill-Qwen-1.5B (or hub id).
Hardware: a TPU v4-32 / v5e-32 pod slice or 8 × 80 GB GPUs (8,192-token rollouts).
Expected run time: several days for 200 ES steps on 32 chips; GRPO faster per step.
Expected result (paper, ×100 Pass@1/16/32, math average): base 47.7/73.5/77.4, GRPO 52.9/74.7/78.0,
ES 49.9/75.0/78.9, ES→GRPO 52.3/75.8/79.2, GRPO→ES 51.6/76.2/78.2.
`:smoke`: a random 2-layer model, the shipped DeepScaleR / MATH-500 format samples, a few steps:
under a minute on CPU; checks the plumbing only.
"""

from experiments.configs.base import base_config, smoke


def get_config(variant: str | None = None):
  c = base_config()
  c.method = "es"
  c.model.update(source="hf", path="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
  c.data.update(task="deepscaler", split="train", limit=40315, prompts_per_step=64)
  c.eval.update(task="math500", split="test", limit=500, num_samples=32, temperature=0.6,
                max_new_tokens=8192, batch_size=64, ks=(1, 16, 32), every=50,
                periodic_limit=64, periodic_num_samples=4)
  # eval.batch_size=64: 64 rows x (256 + 8192) tokens compile to 32.4 GiB per v5p chip; 264 rows
  # needed 123 GiB (docs/tpu_plan.md).
  # Hard: sampled fitness at temperature 0.6 (docs/method.md §1).
  c.es.update(num_steps=200, population_size=32, sigma=1.5e-3, learning_rate=2.5e-4,
              temperature=0.6, max_new_tokens=8192, members_per_chunk=1)
  # members_per_chunk=1: one member decodes at a time per chip (40 GiB per v5p chip at 8192 tokens).
  c.grpo.update(num_steps=200, num_generations=8, learning_rate=1e-6, beta=0.001,
                temperature=1.0, max_new_tokens=8192, mini_batch_size=256, micro_batch_size=1,
                remat=True)
  # grpo.remat: the update of 8448-token rows compiles to 36.9 GiB per v5p chip with it, 192 GiB
  # of saved attention scores without (docs/tpu_plan.md).
  c.sequential.update(total_steps=200, first_fraction=0.5)
  c.checkpoint.update(every=5, keep=3)
  if variant == "smoke":
    smoke(c, preset="tiny-llama", data="deepscaler", eval_data="math500")
  elif variant:
    raise ValueError(f"deepscaler_hard.py: unknown variant {variant!r}; use none or ':smoke'.")
  c.lock()
  return c
