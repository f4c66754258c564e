"""docs/usage.md's worked example (your HF checkpoint, your JSONL, your reward; ES, GRPO and the
demo comparison) runs as printed, on a tiny random HF checkpoint and tiny files written here, with
overrides that only shrink the budgets."""

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from run_configs import checkpoint_params, cli_env, named_leaves
from tiny_models import tiny_tokenizer, torch_model

from es_jax import models
from experiments.infra.logger import read_metrics
from experiments.runners import model_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Budgets only: one step, two prompts, four new tokens, two evaluation problems.
TINY = [
  "--config.progress=False",
  "--config.es.num_steps=1",
  "--config.es.population_size=2",
  "--config.es.members_per_chunk=2",
  "--config.es.max_new_tokens=4",
  "--config.grpo.num_steps=1",
  "--config.grpo.num_generations=2",
  "--config.grpo.mini_batch_size=0",
  "--config.grpo.max_new_tokens=4",
  "--config.grpo.remat=False",
  "--config.sequential.total_steps=2",
  "--config.data.prompts_per_step=2",
  "--config.eval.limit=2",
  "--config.eval.num_samples=2",
  "--config.eval.ks=(1,2)",
  "--config.eval.max_new_tokens=4",
  "--config.eval.batch_size=4",
  "--config.eval.every=0",
  "--config.demo.runs=es,grpo",
  "--config.export_hf=False",
]


def documented_commands() -> tuple[dict[str, str], list[list[str]]]:
  """The shell variables and the `python -m experiments.main` commands of the marked block."""
  text = open(os.path.join(ROOT, "docs", "usage.md")).read()
  block = text[text.index("<!-- usage-test:") :]
  block = re.search(r"```bash\n(.*?)```", block, re.S).group(1).replace("\\\n", " ")
  variables, commands = {}, []
  for line in block.splitlines():
    if m := re.fullmatch(r"(\w+)=(\S+)", line.strip()):
      variables[m.group(1)] = m.group(2)
    elif line.startswith("python -m experiments.main"):
      commands.append(shlex.split(line))
  return variables, commands


@pytest.mark.slow
def test_usage_worked_example_runs_es_grpo_and_demo(tmp_path):
  model_dir = tmp_path / "my-model"
  torch_model("llama").save_pretrained(model_dir)
  tiny_tokenizer().save_pretrained(model_dir)
  for name, sums in (("train.jsonl", range(2, 8)), ("test.jsonl", range(8, 10))):
    rows = [{"question": f"What is {a} + 1?", "answer": str(a + 1)} for a in sums]
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  docs = open(os.path.join(ROOT, "docs", "usage.md")).read()
  reward = re.search(r"`my_reward.py`.*?```python\n(.*?)```", docs, re.S).group(1)
  (tmp_path / "my_reward.py").write_text(reward)
  variables, commands = documented_commands()
  assert [c[-1] for c in commands] == [
    "--config.eval.path=test.jsonl",
    "--config.method=grpo",
    "--config.method=demo",
  ]
  # One persistent XLA cache for the three commands (the test session's, when it has one): the
  # demo's ES and GRPO runs reuse the programs the first two compiled. It holds executables the
  # runs would compile anyway (experiments.infra.compile_cache).
  cache = os.environ.get("ES_JAX_COMPILE_CACHE") or str(tmp_path / "jax_compile_cache")
  env = cli_env(PYTHONPATH=ROOT, ES_JAX_COMPILE_CACHE=cache)
  config = os.path.join(ROOT, "experiments", "configs", "custom.py")
  workdirs = []
  for command in commands:
    args = [a.replace("$MODEL", str(model_dir)) for a in command]
    args = [config if a == "experiments/configs/custom.py" else a for a in args]
    workdir = args[args.index("--workdir") + 1]
    workdirs.append(tmp_path / workdir)
    args[args.index("--workdir") + 1] = str(tmp_path / workdir)
    assert "MODEL" in variables and any("$MODEL" in a for a in command)
    out = subprocess.run(
      [sys.executable, *args[1:], *TINY],
      cwd=tmp_path,  # train.jsonl, test.jsonl and my_reward.py as the commands name them
      env=env,
      capture_output=True,
      text=True,
      timeout=1800,  # a hang guard only
    )
    assert out.returncode == 0, out.stderr[-3000:]
  es_dir, grpo_dir, demo_dir = workdirs
  for run in (es_dir, grpo_dir, demo_dir / "es", demo_dir / "grpo"):
    table = json.loads((run / "eval" / "table.json").read_text())
    assert set(table["tasks"]) == {"file_test"}, run  # evaluated on test.jsonl
    assert table["tasks"]["file_test"]["num_problems"] == 2
  saved = json.loads((es_dir / "config.json").read_text())
  assert saved["data"]["reward"] == "my_reward.py:score"
  assert saved["model"]["path"] == str(model_dir)
  assert (demo_dir / "report.md").exists() and (demo_dir / "base" / "eval").is_dir()


# custom.py:cpu with the naming overrides; the rest shrinks it to the tiny model (tokens, steps).
SHRINK = [
  "--config.progress=False",
  "--config.es.num_steps=2",
  "--config.es.max_new_tokens=6",
  "--config.grpo.num_steps=2",
  "--config.grpo.max_new_tokens=6",
  "--config.eval.limit=2",
  "--config.eval.max_new_tokens=4",
]
# A reward that varies on a random model (the parity of the completion's length).
PARITY = (
  "def score(completion: str, example: dict) -> float:\n  return float(len(completion) % 2)\n"
)


@pytest.mark.slow
def test_cpu_variant_trains_with_the_naming_overrides(tmp_path):
  model_dir = tmp_path / "my-model"
  torch_model("llama").save_pretrained(model_dir)
  tiny_tokenizer().save_pretrained(model_dir)
  rows = [{"question": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(2, 10)]
  (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "parity.py").write_text(PARITY)
  env = cli_env(PYTHONPATH=ROOT)  # the session's compilation cache and XLA level
  config = os.path.join(ROOT, "experiments", "configs", "custom.py")
  base, _ = model_io.load_model({"source": "hf", "path": str(model_dir)})
  base = named_leaves(models.params(base))
  for method in ("es", "grpo"):
    workdir = tmp_path / method
    naming = [
      f"--config.model.path={model_dir}",
      "--config.data.path=qa.jsonl",
      "--config.data.reward=parity.py:score",
    ]
    method_flag = [] if method == "es" else ["--config.method=grpo"]  # es: the default
    command = ["-m", "experiments.main", f"--config={config}:cpu", f"--workdir={workdir}"]
    out = subprocess.run(
      [sys.executable, *command, *naming, *method_flag, *SHRINK],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=1800,  # a hang guard only
    )
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = [r for r in read_metrics(str(workdir / "metrics.jsonl")) if r["step"] > 0]
    spread = [r.get("fitness/std", r.get("reward/std", 0.0)) for r in metrics]
    assert len(metrics) == 2 and max(spread) > 0, f"{method}: rewards never varied"
    step, params = checkpoint_params(str(workdir / "checkpoints"))
    assert step == 2 and set(params) == set(base)
    assert any(not np.allclose(params[k], base[k]) for k in base), f"{method}: weights never moved"
    assert (workdir / "DONE").exists()
    # log_samples_every is 10: the first and the last step's completions are saved anyway.
    lines = (workdir / "samples.jsonl").read_text().splitlines()
    assert sorted({json.loads(ln)["step"] for ln in lines}) == [1, 2]
