"""The dry run's planned work: completions per stage counted from the config by hand."""

from run_configs import with_fields

from experiments.configs import custom
from experiments.runners import work_plan


def test_cpu_variant_plans_what_its_steps_and_evaluations_generate():
  es = custom.get_config("cpu")
  # ES: 4 steps x N = 8 members x 4 prompts; final evaluation: 16 problems x (4 samples + greedy).
  assert work_plan.plan(es, 16) == [("es", 128, 64), ("final evaluation", 80, 64)]
  grpo = with_fields(es, method="grpo", eval__every=2)
  # GRPO: 4 steps x 4 prompts x G = 4; periodic evaluations before training and after step 2
  # (none after the last step): 4 problems x (2 samples + greedy) each.
  assert work_plan.plan(grpo, 16) == [
    ("base model periodic evaluation", 12, 64),
    ("grpo", 64, 64),
    ("grpo periodic evaluations", 12, 64),
    ("final evaluation", 80, 64),
  ]
  demo = with_fields(es, method="demo", demo__runs="grpo_es")
  # sequential 4 steps split 2 + 2: GRPO then ES; the base model's evaluation first.
  assert work_plan.plan(demo, 16) == [
    ("base model evaluation", 80, 64),
    ("grpo_es: grpo (stage 1)", 2 * 16, 64),
    ("grpo_es: es (stage 2)", 2 * 32, 64),
    ("grpo_es: final evaluation", 80, 64),
  ]


def test_paper_budget_on_a_cpu_shows_its_scale():
  paper = custom.get_config()  # 100 steps, N = 32, 64 prompts, 1,024 tokens, n = 32
  rows = work_plan.plan(paper, 20)
  plan = work_plan.summary(rows, num_params=135_000_000)
  assert plan["completions"]["es"] == 100 * 32 * 64
  assert plan["completions_total"] == sum(c for _, c, _ in rows)
  assert plan["new_tokens_at_most"] == sum(c * t for _, c, t in rows)
  cpu = work_plan.summary(work_plan.plan(custom.get_config("cpu"), 16), num_params=135_000_000)
  assert cpu["new_tokens_at_most"] * 100 < plan["new_tokens_at_most"]
  assert " h " in plan["cpu_estimate"] and " h " not in cpu["cpu_estimate"]
  assert work_plan.plan(with_fields(paper, method="report"), 20) == []
