"""The CPU coverage study: base vs ES vs ES with coverage fitness vs GRPO vs GRPO→ES vs ES→GRPO on
the embedded default (SmolLM2-135M-Instruct, reasoning-gym chain_sum, offline), with enough
held-out problems that Pass@k differences are measured, not guessed.

    python -m experiments.main --config experiments/configs/coverage_study.py \
        --workdir runs/coverage_study
    # one ES run with either shaping:
    python -m experiments.main --config experiments/configs/coverage_study.py:coverage \
        --workdir runs/coverage/coverage

Default variant (`method="demo"`, experiments/studies/demo.py): evaluates the base model, then runs
"es"
(the paper's z-score fitness), "es_coverage" (es.shaping="coverage", es_jax.es.fitness.coverage: a
success on a prompt counts 1 / (1 + the other members' successes on it); same seed, data order
and noise keys as "es"), GRPO and both sequential schedules, each for 12 steps, and evaluates every
final model on 50 problems that are not training prompts (one greedy answer and n = 8 samples at
temperature 0.6 each). report.md gives every Pass@k with its standard error and each run's
difference from the base model with the paired standard error (over problems). Rerunning the command
resumes. Fitness is sampled (temperature 0.6) so that a member's success on a prompt is not all or
nothing.
Runtime, measured per phase on a 2-core CPU (2026-12-04, docs/results/coverage_study.md): an
estimated 85 min on an idle machine (each ES run about 5 min of training and 7.6 min of final
evaluation, each GRPO or sequential run 7.5-14 min and 5.5-6 min), 2-3x that per phase on a
loaded machine.

Variants `zscore` / `coverage`: one ES run (method="es") with that shaping, 30 steps.
`:smoke` (alone or appended, e.g. `:coverage_smoke`): the random tiny model, plumbing only.
"""

from experiments.configs import demo
from experiments.configs.base import smoke

VARIANTS = ("study", "zscore", "coverage")


def get_config(variant: str | None = None):
  name, _, size = (variant or "").partition("_")
  if name == "smoke" and not size:
    name, size = "study", "smoke"
  name = name or "study"
  if name not in VARIANTS or size not in ("", "smoke"):
    raise ValueError(
      f"coverage_study.py: unknown variant {variant!r}; use none, smoke, zscore, coverage, "
      "zscore_smoke or coverage_smoke."
    )
  c = demo.get_config()
  c.unlock()
  # The demo's settings when this study was measured (the demo has since changed them for speed).
  c.eval.update(batch_size=72, periodic_limit=8, periodic_num_samples=4)
  c.grpo.micro_batch_size = 16
  c.es.temperature = 0.6
  c.data.prompts_per_step = 8
  if name == "study":
    c.method = "demo"
    c.demo.runs = "es,es_coverage,grpo,grpo_es,es_grpo"
    c.es.num_steps = c.grpo.num_steps = c.sequential.total_steps = 12
    # chain_sum's two one-digit terms make 200 problems, 143 of them in the 256 training rows:
    # 50 of the other 57 are the evaluation (experiments.evaluation.data). The study's published
    # figures were measured on 200 rows, 141 of them training prompts (to be re-measured).
    c.eval.limit = 50
    c.eval.every = 6
  else:
    c.method = "es"
    c.es.update(shaping=name, num_steps=30)
    c.eval.every = 10
  if size == "smoke":
    smoke(c, preset="tiny-llama", data=None, eval_data=None)
    c.data.limit = 16
  c.lock()
  return c
