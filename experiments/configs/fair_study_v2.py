"""Study v2 of ES against GRPO (docs/results/fair_study_v2.md, a pre-registration): a task with
room to move, an interior σ, several ES arms against one null control, two seeds, interior
tuning winners, 256 evaluation problems at n = 32, and decision rules evaluated in code.

    python -m experiments.main --config experiments/configs/fair_study_v2.py --workdir runs/study_v2
    # start stages over (and every later one): --config.fair.redo=pilots
    # the task candidates, measured on the base model (table below):
    python -m experiments.main --config experiments/configs/fair_study_v2.py:candidate_a \
        --workdir runs/task_a --config.method=evaluate --config.eval.limit=64 \
        --config.eval.num_samples=16 --config.eval.ks='(1,2,4,8,16)'

Hardware: a 2-core CPU, no accelerator or network; rerunning the command resumes where it
stopped (each stage records the config it ran under and refuses to reuse another's).

Task candidates (reasoning-gym, + and −, no parentheses or negation), bundled SmolLM2-135M,
64 problems, n = 16 at T = 0.6, 32 new tokens (`method=evaluate`, the command above):

  candidate   generator                            space      greedy   Pass@1   Pass@16  length
  a           basic_arithmetic, 2 terms, 2 digits  16,200     0.031    0.033    0.359    31.1
  b           basic_arithmetic, 3 terms, 1-2 dig.  > 10^5     0.000    0.019    0.125    31.3
  c           chain_sum, 2 terms, 2 digits         16,200     not measured
  a, 64 tok.  as a with max_new_tokens=64          16,200     0.047    0.047    0.391    57.2
  a, 1-2 dig. as a with min_digits=1               > 16,200   0.047    0.025    0.203    31.3
(measured 2026-12-07 at commits 4746c30, the 64-token row at 68b6813; length: mean generated
tokens.) Neither a
nor b passes the rule below (Pass@1 < 0.1), and nearly every completion is cut at the 32-token
budget (the model writes out its working before the answer); with 64 tokens a barely moves
(Pass@1 0.047, mean length 57 of 64). The task and budget are therefore
NOT chosen yet (a mix of one- and two-digit terms scores lower still, Pass@1 0.025): the next
candidates are easier generators (e.g. one-digit terms with more terms, or chain_sum mixes),
measured the same way before the pre-registration is committed; CHOSEN below is a placeholder.

Choice rule: the candidate whose base Pass@1 and Pass@16 are both within [0.1, 0.9] and whose
Pass@16 is furthest from both ends (room for ES to raise it and for GRPO to narrow it), among
those whose space is at least 10× the problems used: 16 prompts x 100 steps (the longest arm)
+ 256 evaluation problems = 1,856 (10x: 18,560).

Budget (estimated from study v1's measured rates, docs/results/fair_study.md: calibration about
10 min per σ, pilots 18-22 min, ES 1.85 min per step of 16 x 16 = 256 greedy completions, GRPO
2.2 min per step, evaluation 8-11 min per 2,048 samples = 0.23-0.32 s per sample):
  calibration   4-7 σ x 10 min                                              0.7-1.2 h
  pilots        6 x 20 min (+ at most 4 extension pilots: +1.3 h)           2.0 h
  runs          4 ES-type arms x 30 x 1.85 min = 3.7 h; GRPO 30 x 2.2 min   4.8 h
  second seed   best ES arm 0.9 h + GRPO 1.1 h                              2.0 h
  evaluations   8 models x 256 x (32 + 1) = 67,584 samples x 0.23-0.32 s    4.4-6.0 h
  diversity     the best arm's final population (v1: 27 min)                0.5 h
  total                                                                     14.4-16.5 h
About 14 h needs evaluation at the low end of v1's rate (the cost-following decode is expected to
help). An arm that moves sampled Pass@1 adds its and the null's 100-step reruns,
2 x 100 x 1.85 min = 6.2 h, and two evaluations (1.4 h).

`:smoke`: the random tiny model, every stage and arm with tiny sizes (a couple of minutes).
"""

from experiments.configs import fair_study as v1
from experiments.configs.base import smoke


def _arithmetic(terms: int, min_digits: int, max_digits: int) -> dict:
  counts = {"min_terms": terms, "max_terms": terms}
  return {**v1.BASIC_ARITHMETIC, **counts, "min_digits": min_digits, "max_digits": max_digits}


def _chain_sum(terms: int, digits: int) -> dict:
  return {"min_terms": terms, "max_terms": terms, "min_digits": digits, "max_digits": digits}


# name -> (reasoning-gym task, generator options); the header's table measures each.
CANDIDATES = {
  "a": ("reasoning_gym/basic_arithmetic", _arithmetic(2, 2, 2)),
  "b": ("reasoning_gym/basic_arithmetic", _arithmetic(3, 1, 2)),
  "c": ("reasoning_gym/chain_sum", _chain_sum(2, 2)),
  "d": ("reasoning_gym/basic_arithmetic", _arithmetic(3, 1, 1)),
  "e": ("reasoning_gym/basic_arithmetic", _arithmetic(4, 1, 1)),
  "f": ("reasoning_gym/chain_sum", _chain_sum(3, 1)),
  "g": ("reasoning_gym/chain_sum", _chain_sum(4, 1)),
}
CHOSEN = "a"  # a placeholder: no candidate has passed the choice rule yet (table above)


def get_config(variant: str | None = None):
  names = {f"candidate_{k}": k for k in CANDIDATES}
  if variant not in (None, "", "smoke", *names):
    raise ValueError(
      f"fair_study_v2.py: unknown variant {variant!r}; use no variant, ':smoke' or one of "
      f"{', '.join(':' + n for n in names)}."
    )
  c = v1.get_config()
  c.unlock()
  task, options = CANDIDATES[names.get(variant, CHOSEN)]
  c.data.task = c.eval.task = task
  c.data.task_config = dict(options)
  c.eval.task_config = dict(options)
  c.data.limit = 1600  # 100 steps x 16 prompts: the longest arm sees no problem twice
  c.eval.update(
    limit=256, num_samples=32, ks=(1, 2, 4, 8, 16, 32), batch_size=66, every=0, max_new_tokens=32
  )
  c.diversity.update(sigmas=(1e-3, 3e-3, 1e-2, 3e-2), extensions=3)
  c.fair.update(
    design=2,
    alpha_ratios=(0.25, 0.5, 1.0),
    grpo_lrs=(3e-6, 1e-5, 3e-5),
    pilot_steps=6,
    extensions=2,
    sampled_temperature=0.6,
    second_seed=1,
    extend_steps=100,
  )
  if variant == "smoke":
    smoke(c, preset="tiny-llama", data=None, eval_data=None)
    c.data.limit = 16
    c.eval.update(ks=(1, 2))
    c.diversity.update(sigmas=(1e-3, 3e-2), extensions=1)
    # One value per grid: its winner is at both edges, so each grid is extended once.
    c.fair.update(alpha_ratios=(1.0,), grpo_lrs=(1e-5,), pilot_steps=1, extensions=1)
    c.fair.extend_steps = 3
  c.lock()
  return c
