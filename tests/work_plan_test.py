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


def test_fair_study_plans_every_stage_and_apart_what_an_outcome_may_add():
  from experiments.configs import fair_study, fair_study_v2

  v2 = fair_study_v2.get_config()  # N = 16, 16 prompts, G = 8, 30 steps, 256 problems x (32 + 1)
  rows = dict((s, c) for s, c, _ in work_plan.plan(v2, 256))
  evaluation, es, grpo = 256 * 33, 30 * 16 * 16, 30 * 16 * 8
  assert rows["calibration: base model"] == 16
  # per σ of the 4-σ grid: 16 members x 16 problems greedy, and x 8 samples for JS_succ
  assert sum(c for s, c in rows.items() if s.startswith("calibration σ=")) == 4 * (256 + 2048)
  assert sum(c for s, c in rows.items() if s.startswith("pilots: es")) == 3 * 6 * 256
  assert sum(c for s, c in rows.items() if s.startswith("pilots: grpo")) == 3 * 6 * 128
  arms = [s for s in rows if s.startswith("runs: ") and not s.endswith("evaluation")]
  assert len(arms) == 7 and sum(rows[s] for s in arms) == 5 * es + 2 * grpo
  assert sum(c for s, c in rows.items() if s.endswith("evaluation")) == 8 * evaluation
  assert sum(c for s, c in rows.items() if s.startswith("diversity")) == 3 * 16 * 16 * 8
  # the doc's hand count: 129,808 completions before the diversity stage
  assert sum(rows.values()) == 129_808 + 3 * 2048
  extra = dict((s, c) for s, c, _ in work_plan.conditional(v2, 256))
  assert sum(c for s, c in extra.items() if s.endswith(", long")) == 4 * 100 * 256
  assert sum(c for s, c in extra.items() if s.startswith("pilot extensions")) == 2 * (1536 + 768)
  assert sum(c for s, c in extra.items() if s.startswith("calibration extension")) == 3 * 2304
  summary = work_plan.summary(work_plan.plan(v2, 256), 135_000_000, work_plan.conditional(v2, 256))
  assert summary["conditional"]["completions_total"] == sum(extra.values())
  v1 = fair_study.get_config()  # demo.runs = es, es_null, grpo; no extensions in design 1
  rows = dict((s, c) for s, c, _ in work_plan.plan(v1, 128))
  assert rows["runs: base model evaluation"] == 128 * 17
  for name, method in (("es", "es"), ("es_null", "es"), ("grpo", "grpo")):
    assert rows[f"runs: {name}: {method}"] == 30 * 16 * (16 if method == "es" else 8)
    assert rows[f"runs: {name}: final evaluation"] == 128 * 17
  assert not any(
    s.startswith("pilot ext") or "long" in s for s, _, _ in work_plan.conditional(v1, 128)
  )
  assert work_plan.conditional(custom.get_config("cpu"), 16) == []
