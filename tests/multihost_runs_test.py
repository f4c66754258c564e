"""`python -m experiments.main` as two jax.distributed CPU processes (localhost coordinator, one
CPU device each, gloo collectives) for es and sequential (GRPO, then ES) on the `:smoke` config:
each host scores the rows on its own device, only rewards cross hosts, process 0 alone writes the
workdir, and each stage's final weights equal a one-process run's on the same ('pop' = 2) mesh."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from run_configs import (
  ROOT,
  assert_trained,
  checkpoint_params,
  named_leaves,
  smoke_config,
  wait_for_processes,
)

from es_jax.persist.checkpoint import Checkpointer
from experiments.configs import demo as demo_config
from experiments.runners import es_runner, sequential

pytestmark = pytest.mark.slow  # each test launches two-process training runs

DEADLINE_S = 900  # generous: a loaded 2-core machine compiles slowly
# Small runs on a 2-device 'pop' axis; the sequential run keeps its final evaluation (written once).
# ES alone is compared bit for bit; GRPO is the sequential run's first stage (2 GRPO steps, then 2
# ES steps: each stage's checkpoint is compared), trained by the grpo_runner.train that
# method=grpo runs, so a separate GRPO launch would check nothing more.
COMMON = dict(mesh__pop=2, eval__every=0, eval__final=False, export_hf=False, checkpoint__every=1)
RUNS = {
  "es": (es_runner, dict(es__num_steps=2), ("checkpoints",)),
  "sequential": (
    sequential,
    dict(sequential__total_steps=4, eval__final=True),
    (os.path.join("stage1_grpo", "checkpoints"), os.path.join("stage2_es", "checkpoints")),
  ),
}


def _restore(ckpt_dir, abstract_state=None):
  ckpt = Checkpointer(str(ckpt_dir), async_save=False)
  try:
    return ckpt.restore(abstract_state=abstract_state)
  finally:
    ckpt.close()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _flags(method: str, overrides: dict) -> list[str]:
  flags = [f"--config.method={method}", "--config.progress=False"]
  for name, value in {**COMMON, **overrides}.items():
    flags.append(f"--config.{name.replace('__', '.')}={value}")
  return flags


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
  """One persistent XLA cache for the launches (the sequential run reuses the ES run's
  programs); it holds executables the runs would compile anyway, and changes no result."""
  return str(tmp_path_factory.mktemp("jax_compile_cache"))


def _launch(workdir, method: str, overrides: dict, cache: str) -> None:
  port = _free_port()
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_NUM_CPU_DEVICES="1",
    JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
    JAX_NUM_PROCESSES="2",
    JAX_COMPILATION_CACHE_DIR=cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
  )
  # The workers compile at this process's XLA optimisation level (tests/conftest.py), so that their
  # results can equal the in-process reference bit for bit; the fake-device flags stay behind.
  flags = os.environ.get("XLA_FLAGS", "").split()
  env["XLA_FLAGS"] = " ".join(f for f in flags if "optimization_level" in f)
  config = os.path.join(ROOT, "experiments", "configs", "demo.py")
  command = [sys.executable, "-m", "experiments.main", f"--config={config}:smoke"]
  command += [f"--workdir={workdir}", *_flags(method, overrides)]
  procs = [
    subprocess.Popen(
      command,
      cwd=ROOT,
      env=dict(env, JAX_PROCESS_ID=str(i)),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
    )
    for i in range(2)
  ]
  wait_for_processes(procs, DEADLINE_S, label=f"{method} ", tail=3000)


@pytest.mark.parametrize("method", list(RUNS))
def test_two_processes_train_as_one(method, tmp_path, compile_cache):
  module, overrides, ckpts = RUNS[method]
  one, two = tmp_path / "one", tmp_path / "two"
  # The reference: this process, the first two of its CPU devices as the 'pop' axis.
  module.run(smoke_config(demo_config, method=method, **{**COMMON, **overrides}), str(one))
  _launch(two, method, overrides, compile_cache)
  assert os.path.exists(two / "DONE")
  for ckpt in ckpts:
    step, want = checkpoint_params(one / ckpt)
    assert_trained(one, want)  # rewards varied and weights moved: the comparison shows something
    template = _restore(one / ckpt).state  # the two-host run's layout restored as this one's
    restored = _restore(two / ckpt, template)
    assert restored.meta["step"] == step
    state = restored.state
    got = named_leaves(state["params"] if isinstance(state, dict) else state.params)
    assert set(got) == set(want)
    # ES: greedy members, keyed noise, rewards summed in member order: the same bits. GRPO: the
    # same rows on the same two devices; 1e-6 allows for another all-reduce order.
    tol = 0 if method == "es" else 1e-6
    for name, value in want.items():
      np.testing.assert_allclose(got[name], value, rtol=tol, atol=tol, err_msg=f"{ckpt}: {name}")
  rows = [json.loads(line) for line in open(two / "metrics.jsonl")]
  assert [r["step"] for r in rows] == sorted({r["step"] for r in rows})  # one writer
  if overrides.get("eval__final"):  # each record once, as the one-process run has them
    name = "reasoning_gym_chain_sum.jsonl"
    records = [json.loads(line) for line in open(two / "eval" / name)]
    expected = [json.loads(line) for line in open(one / "eval" / name)]
    assert [r["index"] for r in records] == list(range(len(expected)))
    for field in ("correct", "answers", "num_tokens", "greedy_length"):
      assert [r.get(field) for r in records] == [r.get(field) for r in expected], field
