"""README.md's Python API example runs as printed and the ES update in the optax chain climbs the
fitness (from -36 at w = 0 to near its maximum 0 at w = 3); with ``rank=`` added to its spec, its
members are evaluated and updated low rank, with the same noise."""

import contextlib
import io
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_configs import cli_env

import es_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_code() -> str:
  text = open(os.path.join(ROOT, "README.md")).read()
  section = text[text.index("## Python API") :]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _fitness_line(stdout: str) -> tuple[float, float]:
  return tuple(map(float, re.fullmatch(r"fitness (\S+) -> (\S+)\n", stdout).groups()))


@pytest.mark.slow
def test_readme_python_example_runs_and_improves():
  out = subprocess.run(
    [sys.executable, "-c", _readme_code()],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    # The one subprocess test compiling at XLA's default optimisation level, as a user's program
    # does (the others compile at the test process's level: tests/run_configs.py's cli_env).
    env=cli_env(default_level=True),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  before, after = _fitness_line(out.stdout)
  assert before == -36.0
  assert after > -0.05, out.stdout


def test_readme_example_with_rank_evaluates_and_updates_low_rank(monkeypatch):
  # A user adds rank=2 to the README's spec, on a matrix parameter (a vector gets full-rank noise
  # whatever the rank). The members are built from that spec, so they are low rank too.
  code = _readme_code()
  code = code.replace("antithetic=True)", "antithetic=True, rank=2)")
  code = code.replace("jnp.zeros(4)", "jnp.zeros((6, 6))")
  assert code.count("rank=2") == 1 and code.count("jnp.zeros((6, 6))") == 2, code
  real, seen = es_jax.perturb_member, []

  def recording(params, key, i, sigma, spec, **kw):
    seen.append(spec)  # at trace time: the spec the README's members are built with
    return real(params, key, i, sigma, spec, **kw)

  monkeypatch.setattr(es_jax, "perturb_member", recording)
  namespace, out = {}, io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, "README.md", "exec"), namespace)
  spec, sigma = namespace["spec"], namespace["sigma"]
  assert spec.rank == 2 and seen and all(s == spec for s in seen)
  before, after = _fitness_line(out.getvalue())
  assert before == -324.0 and after > before / 4, out.getvalue()  # climbs (-42 here)

  # Each member is θ + σ ε_i with ε_i of rank <= 2, and the update regenerates exactly that ε_i.
  params, key = {"w": jnp.zeros((6, 6))}, jax.random.key(7)
  n = spec.population_size
  for i in (0, 3):
    eps = (np.asarray(real(params, key, i, sigma, spec)["w"]) - np.asarray(params["w"])) / sigma
    assert np.linalg.matrix_rank(eps, tol=1e-4) <= 2 < np.linalg.matrix_rank(np.eye(6))
    onehot = jnp.zeros((n,)).at[i].set(n)
    direction = es_jax.es_update_direction(params, onehot, key, spec)["w"]
    np.testing.assert_allclose(np.asarray(direction), eps, rtol=1e-4, atol=1e-4)
