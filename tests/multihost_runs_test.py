"""`python -m experiments.main` as two jax.distributed CPU processes (localhost coordinator, one
CPU device each, gloo collectives) on the `:smoke` config: a sequential ES→GRPO run, so that one
launch trains with both runners. Each host scores the rows on its own device, only rewards cross
hosts, process 0 alone writes the workdir, each stage's final weights equal a one-process run's
on the same ('pop' = 2) mesh, and the final evaluation's records are written once."""

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
from experiments.runners import sequential

pytestmark = pytest.mark.slow  # launches a two-process training run

DEADLINE_S = 900  # generous: a loaded 2-core machine compiles slowly
# Two ES steps, then two GRPO steps, on a 2-device 'pop' axis, with the final evaluation. Stage one
# (es_runner.train, as method=es) is compared bit for bit, stage two (grpo_runner.train, as
# method=grpo) at 1e-6: one launch checks both runners across hosts.
OVERRIDES = dict(
  mesh__pop=2,
  eval__every=0,
  eval__final=True,
  export_hf=False,
  checkpoint__every=1,
  sequential__order="es_grpo",
  sequential__total_steps=4,
)
# Each stage's checkpoints and the tolerance its weights are compared at: ES (greedy members,
# keyed noise, rewards summed in member order) gives the same bits; GRPO the same rows on the
# same two devices, 1e-6 allowing for another all-reduce order.
STAGES = {
  os.path.join("stage1_es", "checkpoints"): 0.0,
  os.path.join("stage2_grpo", "checkpoints"): 1e-6,
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


def _flags(overrides: dict) -> list[str]:
  flags = ["--config.method=sequential", "--config.progress=False"]
  for name, value in overrides.items():
    flags.append(f"--config.{name.replace('__', '.')}={value}")
  return flags


def _launch(workdir, overrides: dict) -> None:
  port = _free_port()
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_NUM_CPU_DEVICES="1",
    JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
    JAX_NUM_PROCESSES="2",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
  )
  # The workers compile at this process's XLA optimisation level (tests/conftest.py), so that their
  # results can equal the in-process reference bit for bit; the fake-device flags stay behind.
  flags = os.environ.get("XLA_FLAGS", "").split()
  env["XLA_FLAGS"] = " ".join(f for f in flags if "optimization_level" in f)
  config = os.path.join(ROOT, "experiments", "configs", "demo.py")
  command = [sys.executable, "-m", "experiments.main", f"--config={config}:smoke"]
  command += [f"--workdir={workdir}", *_flags(overrides)]
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
  wait_for_processes(procs, DEADLINE_S, tail=3000)


def test_two_processes_train_as_one(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  # The reference: this process, the first two of its CPU devices as the 'pop' axis.
  sequential.run(smoke_config(demo_config, method="sequential", **OVERRIDES), str(one))
  _launch(two, OVERRIDES)
  assert os.path.exists(two / "DONE")
  for ckpt, tol in STAGES.items():
    step, want = checkpoint_params(one / ckpt)
    assert_trained(one, want)  # rewards varied and weights moved: the comparison shows something
    template = _restore(one / ckpt).state  # the two-host run's layout restored as this one's
    restored = _restore(two / ckpt, template)
    assert restored.meta["step"] == step
    state = restored.state
    got = named_leaves(state["params"] if isinstance(state, dict) else state.params)
    assert set(got) == set(want)
    for name, value in want.items():
      np.testing.assert_allclose(got[name], value, rtol=tol, atol=tol, err_msg=f"{ckpt}: {name}")
  rows = [json.loads(line) for line in open(two / "metrics.jsonl")]
  assert [r["step"] for r in rows] == sorted({r["step"] for r in rows})  # one writer
  name = "reasoning_gym_chain_sum.jsonl"  # each record once, as the one-process run has them
  records = [json.loads(line) for line in open(two / "eval" / name)]
  expected = [json.loads(line) for line in open(one / "eval" / name)]
  assert [r["index"] for r in records] == list(range(len(expected)))
  for field in ("correct", "answers", "num_tokens", "greedy_length"):
    assert [r.get(field) for r in records] == [r.get(field) for r in expected], field
