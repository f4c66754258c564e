"""The embedded default: SmolLM2-135M-Instruct on reasoning-gym chain_sum (offline), CPU minutes.

    python -m experiments.main --config experiments/configs/demo.py --workdir runs/demo
    python -m experiments.main --config experiments/configs/demo.py:smoke --workdir /tmp/smoke

Hardware: any CPU (2 cores are enough); no accelerator or network.
Default variant: the README's demo (`method="demo"`): evaluates the base model, runs ES, GRPO,
GRPO→ES and ES→GRPO with a small budget (6 steps each, 2 + 2 sequential), evaluates each and
writes report.md; 941 s of CPU time, 10.2 min on a loaded 2-core CPU (docs/benchmarks.md).
Use --config.method=es|grpo|sequential for one method.
Expected result: SmolLM2 solves part of the two-term one-digit sums (greedy ≈ 0.25-0.5 on 32 test
problems), so ES and GRPO have a reward signal to improve on; with this small budget the changes
are small and noisy: the report shows whatever was measured.
`:smoke`: a random 2-layer model with the SmolLM2 tokenizer, a few steps of every stage; under a
minute on CPU; checks the plumbing, not learning.
"""

from experiments.configs.base import base_config, smoke

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def get_config(variant: str | None = None):
  c = base_config()
  c.method = "demo"
  c.data.task = c.eval.task = "reasoning_gym/chain_sum"
  c.data.task_config = dict(CHAIN_SUM)
  c.eval.task_config = dict(CHAIN_SUM)
  c.data.limit = 256
  c.data.prompts_per_step = 4
  c.eval.limit = 32
  c.eval.num_samples = 8
  c.eval.ks = (1, 2, 4, 8)
  c.eval.max_new_tokens = 32
  # 32 rows: the greedy batch holds the 32 problems without padding rows, and the sampled batches
  # have the GRPO rollout's shape (4 prompts x 8), so the two can share a compiled program.
  c.eval.batch_size = 32
  # No periodic evaluation (every = 0): the report shows the final evaluations only, and each
  # run's evaluation before training would repeat the base model's.
  c.eval.every = 0
  # ES: EGGROLL low rank (r = 4) so that a CPU step costs about one batched inference: full-rank
  # ES (the paper's; --config.es.rank=0) measured ~55 s per step here against ~10 s, mostly
  # drawing 135M normals per member twice. A small population; σ, α as Qiu et al. (1e-3, 5e-4).
  # GRPO: lr 1e-5 (10x the paper's 1e-6, for a budget of 6 steps), no KL (β = 0). Budgets of
  # 6 steps (2 + 2 sequential) keep `make demo` within 15 minutes on 2 cores (docs/benchmarks.md).
  c.es.update(
    num_steps=6,
    population_size=8,
    members_per_chunk=8,
    sigma=1e-3,
    learning_rate=5e-4,
    max_new_tokens=32,
    rank=4,
  )
  c.grpo.update(
    num_steps=6,
    num_generations=8,
    learning_rate=1e-5,
    beta=0.0,
    max_new_tokens=32,
    micro_batch_size=8,  # 4 accumulation steps: 0.9 GB less for the update than 16 rows
  )
  c.sequential.update(total_steps=4, first_fraction=0.5)
  c.checkpoint.update(every=5, keep=2)
  if variant == "smoke":
    smoke(c, preset="tiny-llama", data=None, eval_data=None)
    c.data.limit = 16
  elif variant:
    raise ValueError(f"demo.py: unknown variant {variant!r}; use no variant or ':smoke'.")
  c.lock()
  return c
