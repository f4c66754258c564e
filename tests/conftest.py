"""Shared fixtures. Eight fake CPU devices so sharded code is tested against single-device code."""

import gc
import os

os.environ.setdefault("XLA_FLAGS", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture
def key():
  return jax.random.key(0)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops every compiled program after each test file.

  XLA:CPU maps each compiled program's code and data into the process (three or more memory
  maps each) and keeps it while a cache holds the program. One pytest worker runs dozens of
  files and compiles thousands of programs; without this it reaches the kernel's
  vm.max_map_count (65530) and the next compile segfaults inside XLA.
  """
  yield
  jax.clear_caches()
  gc.collect()
