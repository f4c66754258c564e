"""Shared fixtures. Eight fake CPU devices so sharded code is tested against single-device code."""

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
