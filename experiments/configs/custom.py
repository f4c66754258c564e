"""Your own model, question/answer file and reward with the paper's method settings.

    python -m experiments.main --config experiments/configs/custom.py --workdir runs/mine \
        --config.model.path=/models/my-hf-model --config.data.path=data/train.jsonl \
        [--config.method=es|grpo|sequential|demo]

Required: `model.path` (a local HF directory: config.json, *.safetensors, tokenizer files; for a
GGUF file also --config.model.source=gguf) and `data.path` (a .jsonl / .json / .csv / .parquet
file, or a `datasets` save_to_disk split directory, of {"question": ..., "answer": ...} rows; other
field names with data.question_field and data.answer_field). A missing one is a one-line error. The
reward is exact match of the <answer></answer> text (`qa`); pick another with
--config.data.reward=math|gsm8k|choice|code or your function,
--config.data.reward=my_reward.py:score, `score(completion: str, example: dict) -> float`
(maximised; a sample is correct in evaluation when it scores >= 1). The prompt is the model's chat
template with the reward's answer format; --config.data.prompt_template="Q: {question}\\nA:" feeds
a plain template instead. Evaluation reads --config.eval.path (default: the training file itself,
with a warning); rows that are training questions are counted and warned about
(--config.eval.drop_seen=True drops them). docs/usage.md has a worked example.

Settings: the paper's (docs/method.md §10): ES N = 32, σ = 1.5e-3, α = 2.5e-4, greedy fitness;
GRPO G = 8, lr 1e-6, β = 0.001, ε = 0.2, temperature 1.0; 64 prompts per step; evaluation n = 32
samples at T = 0.6 plus one greedy, Pass@1/16/32. Budgets: 100 steps each (sequential: 100 in
all), 1,024 new tokens. method=demo runs base, ES, GRPO, GRPO→ES and ES→GRPO and writes report.md.
Hardware: an accelerator for a model of 0.5B parameters or more (every step generates N x 64
completions).
`:cpu`: the same with a budget of minutes on a 2-core CPU for a model of about 135M parameters
(4 steps of 4 prompts, ES N = 8 at rank 4, GRPO G = 4, 64 new tokens, 16 evaluation problems at
n = 4; docs/usage.md has the measured times); method=demo compares base, ES and GRPO.
`:smoke`: a random 2-layer model on experiments/configs/sample_data/custom/qa.jsonl (evaluated on
qa_test.jsonl, none of whose questions is a training one), a few steps; under a minute on CPU;
checks the plumbing, not learning.
"""

from experiments.configs.base import base_config, sample_dir, smoke


def get_config(variant: str | None = None):
  c = base_config()
  c.method = "es"
  c.model.update(source="hf", path="")
  c.data.update(task="file", path="", limit=None, prompts_per_step=64, reward="qa", task_config={})
  c.eval.update(
    task="file",
    path="",
    limit=256,
    num_samples=32,
    temperature=0.6,
    max_new_tokens=1024,
    batch_size=64,
    ks=(1, 16, 32),
    every=10,
    periodic_limit=64,
    periodic_num_samples=4,
    task_config={},
  )
  c.es.update(num_steps=100, max_new_tokens=1024, members_per_chunk=1)
  c.grpo.update(
    num_steps=100, max_new_tokens=1024, mini_batch_size=256, micro_batch_size=2, remat=True
  )
  c.sequential.update(total_steps=100, first_fraction=0.5)
  c.checkpoint.update(every=10, keep=3)
  if variant == "smoke":
    c.data.limit = 24
    smoke(c, preset="tiny-llama", data=None, eval_data=None)
    c.data.path = f"{sample_dir('custom')}/qa.jsonl"
    c.eval.path = f"{sample_dir('custom')}/qa_test.jsonl"  # held out: no training question
  elif variant == "cpu":
    cpu(c)
  elif variant:
    raise ValueError(f"custom.py: unknown variant {variant!r}; use no variant, ':cpu' or ':smoke'.")
  c.lock()
  return c


def cpu(c):
  """Turns `c` into its `:cpu` variant in place: a budget of minutes on a 2-core CPU for a model
  of about 135M parameters (the demo config's method settings: EGGROLL rank 4 for ES, lr 1e-5
  and no KL for GRPO), the same for every method, so that each runs with the naming overrides
  alone (model.path, data.path, data.reward and method)."""
  c.data.prompts_per_step = 4
  c.eval.update(
    limit=16,
    num_samples=4,
    ks=(1, 4),
    max_new_tokens=64,
    batch_size=40,  # 8 problems x (4 samples + 1 greedy)
    every=0,
    periodic_limit=4,
    periodic_num_samples=2,
  )
  c.es.update(
    num_steps=4,
    population_size=8,
    members_per_chunk=8,
    sigma=1e-3,
    learning_rate=5e-4,
    rank=4,
    max_new_tokens=64,
  )
  c.grpo.update(
    num_steps=4,
    num_generations=4,
    learning_rate=1e-5,
    beta=0.0,
    max_new_tokens=64,
    mini_batch_size=0,  # the whole rollout: 4 prompts x 4 completions
    micro_batch_size=8,
    remat=False,
  )
  c.sequential.update(total_steps=4, first_fraction=0.5)
  c.demo.runs = "es,grpo"  # base, ES and GRPO; add grpo_es,es_grpo for the sequential runs
  c.checkpoint.update(every=2, keep=2)
  c.mesh.pop = 1
  return c
