"""Experiment configs for runner tests (a config file's variant with `a__b=value` overrides) and
the checks they share on a finished run directory."""

import json
import math
import os
import subprocess
import time

import jax
import numpy as np
from ml_collections import ConfigDict

from es_jax import models
from es_jax.es import noise
from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import demo as demo_config
from experiments.infra.logger import read_metrics
from experiments.runners import model_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_env(default_level: bool = False, **extra: str) -> dict[str, str]:
  """The environment of a `python -m experiments.main` subprocess: this process's, on the CPU and
  offline, with `extra` set. It compiles with the test process's cheap-compile XLA flags
  (tests/conftest.py TEST_XLA_FLAGS: the same results), loading what the session compiled from
  the session's cache; the test process's other XLA flags stay behind. `default_level=True`: XLA's
  default flags, as a user's run compiles (one test keeps it: docs/testing.md)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  flags = [] if default_level else os.environ.get("XLA_FLAGS", "").split()
  keep = ("xla_backend_optimization_level", "xla_cpu_use_fusion_emitters")  # conftest's
  env["XLA_FLAGS"] = " ".join(f for f in flags if any(k in f for k in keep))
  env.pop("ES_JAX_TRACEBACK", None)
  env.update(extra)
  return env


def with_fields(config, **fields) -> ConfigDict:
  """A copy of `config` with `section__field=value` fields set, locked as the CLI locks it."""
  c = ConfigDict(config.to_dict())
  for dotted, value in fields.items():
    node = c
    *parents, leaf = dotted.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  c.lock()
  return c


def smoke_config(module, variant="smoke", **overrides) -> ConfigDict:
  """`module.get_config(variant)` with progress bars off and `section__field=value` overrides."""
  return with_fields(module.get_config(variant), progress=False, **overrides)


def finite_metrics(workdir):
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  assert rows, "no metrics"
  for r in rows:
    for k, v in r.items():
      if isinstance(v, float):
        assert math.isfinite(v), (k, r["step"])
  return rows


def checkpoint_params(ckpt_dir, step=None):
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    restored = ckpt.restore(step)
  finally:
    ckpt.close()
  state = restored.state
  params = state["params"] if isinstance(state, dict) and "params" in state else state[0]
  return restored.meta["step"], named_leaves(params)


def named_leaves(tree) -> dict[str, np.ndarray]:
  """{"layers/wq": array, ...}: every leaf by its path."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(map(str, noise.path_names(p))): np.asarray(v) for p, v in flat}


def assert_trained(workdir, params, dtype=None):
  """The run's rewards varied (across ES members or GRPO samples) and its weights left the base
  model's: only then does comparing two runs' weights show anything. Smoke configs score with
  es_jax.rewards.synthetic.char_parity, which varies on a random model."""
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  spread = [r.get("fitness/std", r.get("reward/std", 0.0)) for r in rows if r["step"] > 0]
  assert spread and max(spread) > 0, "rewards never varied"
  model, _ = model_io.load_model(smoke_config(demo_config).model, seed=0)
  base = models.params(model) if dtype is None else models.cast_params(models.params(model), dtype)
  base = named_leaves(base)
  assert set(base) == set(params)
  assert any(not np.array_equal(params[k], base[k]) for k in params), "weights never moved"


def assert_resumed_steps_trained(rows, resumed_from, restored, params):
  """The steps a resumed run re-ran (metrics `rows` after step `resumed_from`) each had rewards
  that varied, and moved the weights from the checkpoint it resumed from (`restored`) to `params`.
  Only then does matching an uninterrupted run show the resume restored the keys and optimizer
  state: on constant rewards an ES or GRPO step is the same whatever its key."""
  spread = [
    r.get("fitness/std", r.get("reward/std", 0.0)) for r in rows if r["step"] > resumed_from
  ]
  assert spread and min(spread) > 0, f"rewards after step {resumed_from} did not vary: {spread}"
  assert set(restored) == set(params)
  moved = [k for k in params if not np.array_equal(params[k], restored[k])]
  assert moved, f"no weight moved after step {resumed_from}"


def assert_run_outputs(workdir, ckpt_dir):
  assert os.path.exists(os.path.join(workdir, "DONE"))
  assert Checkpointer(ckpt_dir, async_save=False).all_steps()
  rows = finite_metrics(workdir)
  assert rows[0]["step"] == 0 and "eval/pass@1" in rows[0]  # the base model's periodic eval
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  # The final evaluation is in TensorBoard too (event files hold tags as plain strings; TensorBoard
  # tags allow no "@", tensorboardX writes "pass@1" as "pass_1").
  tags = b"".join(open(os.path.join(workdir, "tensorboard", e), "rb").read() for e in events)
  assert b"final/pass_1" in tags and b"train/reward" in tags
  assert not os.path.exists(os.path.join(workdir, "versions.1.json"))  # one versions.json
  table = json.load(open(os.path.join(workdir, "eval", "table.json")))
  assert 0.0 <= table["macro"]["pass@1"] <= 1.0
  plots = ("reward.png", "reward_samples.png", "entropy.png", os.path.join("eval", "pass_at_k.png"))
  for name in plots:
    assert os.path.getsize(os.path.join(workdir, name)) > 1000
  assert os.path.exists(os.path.join(workdir, "hf", "config.json"))
  assert json.load(open(os.path.join(workdir, "config.json")))["method"]
  # Where the examples came from: source directory, the files' SHA-256, rows used.
  sources = json.load(open(os.path.join(workdir, "versions.json")))["data"]
  assert sources["data"]["used"] > 0 and sources["eval"]["used"] > 0
  for s in sources.values():
    assert s.get("generator") == "reasoning_gym" or (s["source_dir"] and s["rows"] >= s["used"])
  return rows


def wait_for_processes(procs, deadline_s: float, label: str = "", tail: int = 4000) -> None:
  """Waits for every process (killed past `deadline_s` in all); fails with each one's exit
  status and stderr tail unless all exited 0."""
  start, logs = time.monotonic(), []
  try:
    for p in procs:
      _, err = p.communicate(timeout=max(1.0, deadline_s - (time.monotonic() - start)))
      logs.append(err.decode(errors="replace"))
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    logs = [p.communicate()[1].decode(errors="replace") for p in procs]
  report = "\n".join(
    f"--- {label}process {i} (exit {p.returncode}) stderr ---\n{log[-tail:]}"
    for i, (p, log) in enumerate(zip(procs, logs, strict=True))
  )
  assert all(p.returncode == 0 for p in procs), report
