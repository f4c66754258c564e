"""One process of tests/multihost_test.py: joins a 2-process CPU run, takes one ES step and one
GRPO step on a mesh spanning both processes, and saves what it computed.

Usage: python tests/multihost_worker.py PROCESS_ID PORT OUT.npz
"""

import os
import sys

import numpy as np

os.environ["JAX_PLATFORMS"] = "cpu"
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from es_jax.devices import sharding  # noqa: E402

process_id, port, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
assert sharding.initialize_distributed(
  coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id
)
assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2

import multihost_case  # noqa: E402  (imported after start-up: it builds arrays)
from jax.experimental import multihost_utils  # noqa: E402

calls = []
mesh = sharding.make_mesh(pop=4, model=1)
es_out = multihost_case.es_step(mesh, calls)
grpo_out = multihost_case.grpo_step(mesh, allgather=multihost_utils.process_allgather)
np.savez(out_path, calls=np.asarray(calls, np.int64), **es_out, **grpo_out)
jax.distributed.shutdown()
