"""README.md's Python API example runs as printed and the ES update in the optax chain climbs the
fitness (from -36 at w = 0 to near its maximum 0 at w = 3)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_example_runs_and_improves():
  text = open(os.path.join(ROOT, "README.md")).read()
  section = text[text.index("## Python API") :]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  out = subprocess.run(
    [sys.executable, "-c", code],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert out.returncode == 0, out.stderr[-2000:]
  before, after = map(float, re.fullmatch(r"fitness (\S+) -> (\S+)\n", out.stdout).groups())
  assert before == -36.0
  assert after > -0.05, out.stdout
