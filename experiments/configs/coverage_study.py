"""Coverage-targeted ES fitness vs the paper's z-score, on the embedded default (SmolLM2-135M,
reasoning-gym chain_sum, offline, like demo.py).

    python -m experiments.main --config experiments/configs/coverage_study.py:zscore \
        --workdir runs/coverage/zscore
    python -m experiments.main --config experiments/configs/coverage_study.py:coverage \
        --workdir runs/coverage/coverage
    # then, for each run: --config.method=diversity --config.diversity.run=runs/coverage/<name>

Variants: `zscore` (es.shaping="zscore", the paper) and `coverage` (es.shaping="coverage",
es_jax.fitness.coverage: a success counts 1 / (1 + the other members' successes on that
prompt)); everything else is equal (seed, data order, noise keys), so the step-0 populations are
identical. Compare Pass@1 vs Pass@8 in each run's eval/table.md and JS_succ of the diversity
study. Fitness is sampled (temperature 0.6) so that a member's success on a prompt is not all or
nothing. `:smoke` (append to either, e.g. `:coverage_smoke`): the random tiny model, plumbing only.
Hardware: a 2-core CPU. Runtime: not measured end to end; demo.py's ES stage at these sizes
(N = 8, r = 4, 4 prompts, 32 tokens) takes about 10 s per step on a 2-core CPU, so 30 steps plus
the evaluations come to roughly 10 minutes per variant.
"""

from experiments.configs import demo
from experiments.configs.base import smoke

VARIANTS = ("zscore", "coverage")


def get_config(variant: str | None = None):
  name, _, size = (variant or "").partition("_")
  if name not in VARIANTS or size not in ("", "smoke"):
    raise ValueError(
      f"coverage_study.py: unknown variant {variant!r}; use zscore, coverage, zscore_smoke or "
      "coverage_smoke."
    )
  c = demo.get_config()
  c.unlock()
  c.method = "es"
  c.es.update(shaping=name, num_steps=30, temperature=0.6)
  c.data.prompts_per_step = 8
  c.eval.every = 10
  if size == "smoke":
    smoke(c, preset="tiny-llama", data=None, eval_data=None)
    c.data.limit = 16
  c.lock()
  return c
