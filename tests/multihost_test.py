"""Two processes on localhost joined with jax.distributed (CPU backend, gloo collectives, two
CPU devices each) take one ES step and one GRPO step on a mesh spanning both, and agree with
the same steps in this process; each process scores only its own population members."""

import os
import socket
import subprocess
import sys

import multihost_case as case
import numpy as np
import pytest
from run_configs import wait_for_processes

from es_jax.devices import sharding

pytestmark = pytest.mark.slow  # two processes compile and take ES and GRPO steps

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 600  # generous: on a loaded 2-core machine the two workers compile for minutes


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_workers(tmp_path):
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
  # The workers compile at this process's XLA optimisation level (tests/conftest.py), so that their
  # results can equal the in-process reference bit for bit; the fake-device flags stay behind.
  flags = os.environ.get("XLA_FLAGS", "").split()
  env["XLA_FLAGS"] = " ".join(f for f in flags if "optimization_level" in f)
  outs = [tmp_path / f"process{i}.npz" for i in range(2)]
  procs = [
    subprocess.Popen(
      [sys.executable, os.path.join(HERE, "multihost_worker.py"), str(i), str(port), str(out)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
    )
    for i, out in enumerate(outs)
  ]
  wait_for_processes(procs, DEADLINE_S)
  return [dict(np.load(out)) for out in outs]


def test_two_processes_agree_with_one(tmp_path):
  results = _run_workers(tmp_path)
  calls = []
  mesh = sharding.make_mesh(pop=4, model=1)  # the same mesh shape, in this process
  want = {**case.es_step(mesh, calls), **case.grpo_step(mesh)}
  assert len(calls) == case.N  # one process scores every member
  assert len(np.unique(want["es_fitness"])) > 2  # the rewards vary across members
  assert (want["grpo_rewards"].std(axis=1) > 0).sum() >= 2
  p0 = case.params()
  es_moved = max(np.abs(want[f"es/{k}"] - v).max() for k, v in case.flat(p0).items())
  grpo_moved = max(np.abs(want[f"grpo/{k}"] - v).max() for k, v in case.flat(p0).items())
  assert es_moved > 1e-2 and grpo_moved > 1e-3, (es_moved, grpo_moved)

  # Each process scored only the members on its own devices: half of them, disjoint.
  members = [r["es_members"] for r in results]
  np.testing.assert_array_equal(np.sort(np.concatenate(members)), np.arange(case.N))
  for r, m in zip(results, members, strict=True):
    assert len(r["calls"]) == len(m) == case.N // 2
  for i, r in enumerate(results):
    for k, v in want.items():
      if k == "es_members":
        continue
      # ES: the same bits (greedy tokens, keyed noise, summed in member order). GRPO: the same
      # rows on the same four devices; 1e-6 allows for a different all-reduce order.
      tol = 0 if k.startswith("es") else 1e-6
      np.testing.assert_allclose(r[k], v, rtol=tol, atol=tol, err_msg=f"process {i}: {k}")
