"""No import cycle among the `experiments.*` modules.

Every module under experiments/ is parsed with `ast` (nothing is imported), every import statement
is read, at module level, inside functions and under `if TYPE_CHECKING:` alike, and the graph of
imports between experiments modules must have no cycle. A cycle that is hidden by a function-level
import still couples the two modules, so it counts here too.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "experiments"


def _module_files(root: str = ROOT, package: str = PACKAGE) -> dict[str, str]:
  """{dotted module name: path} for every .py file under the package (packages by __init__.py)."""
  out = {}
  for dirpath, _, files in os.walk(os.path.join(root, package)):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join(parts)] = path
  return out


def _imported(module: str, is_package: bool, source: str, known: set[str]) -> set[str]:
  """The modules of `known` that `source` (the text of `module`) imports, anywhere in the file."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from . import x / from .y import x
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    else:
      continue
    for name in names:
      # `import a.b.c` loads a, a.b and a.b.c; the parent packages' __init__ files count too.
      parts = name.split(".")
      for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in known and prefix != module:
          found.add(prefix)
  return found


def import_graph(root: str = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
  """{module: the package's modules it imports}."""
  files = _module_files(root, package)
  graph = {}
  for module, path in files.items():
    with open(path, encoding="utf-8") as f:
      source = f.read()
    is_package = path.endswith("__init__.py")
    graph[module] = _imported(module, is_package, source, set(files))
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (depth-first search, sorted for a stable
  answer). Edges into a package's __init__ (empty here) are kept: an __init__ that imported its
  submodules would close a loop too."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt) :] + [nxt]
      if nxt not in state:
        cycle = visit(nxt)
        if cycle:
          return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def test_experiments_have_no_import_cycle():
  graph = import_graph()
  assert "experiments.config_check" in graph and "experiments.es_runner" in graph  # walk found them
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle in experiments/: " + " -> ".join(cycle)


def test_config_check_imports_no_runner():
  """config_check stands below the runners: it reads allowed values from the config layer."""
  graph = import_graph()
  runners = {
    f"{PACKAGE}.{m}"
    for m in ("es_runner", "grpo_runner", "demo", "diversity", "sequential", "population_sweep")
    + ("model_io",)
  }
  for module in ("experiments.config_check", "experiments.config_rules"):
    assert not graph[module] & runners, f"{module} imports {sorted(graph[module] & runners)}"


def _write(root, rel: str, text: str) -> None:
  path = root / rel
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


@pytest.mark.parametrize(
  "a_text",
  [
    "from pkg import b\n",
    "import pkg.b\n",
    "from pkg.b import thing\n",
    "def f():\n  from pkg import b\n",  # hidden inside a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg.b import Thing\n",
    "from . import b\n",
  ],
)
def test_finds_a_cycle_however_it_is_written(tmp_path, a_text):
  _write(tmp_path, "pkg/__init__.py", "")
  _write(tmp_path, "pkg/a.py", a_text)
  _write(tmp_path, "pkg/b.py", "import os\nfrom pkg import c\n")
  _write(tmp_path, "pkg/c.py", "def g():\n  from pkg.a import f\n")
  cycle = find_cycle(import_graph(str(tmp_path), "pkg"))
  assert cycle is not None and cycle[0] == cycle[-1]
  assert set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}


def test_no_cycle_in_a_chain(tmp_path):
  _write(tmp_path, "pkg/__init__.py", "")
  _write(tmp_path, "pkg/a.py", "from pkg import b\nimport pkg.sub.c\n")
  _write(tmp_path, "pkg/b.py", "from pkg.sub import c\n")
  _write(tmp_path, "pkg/sub/__init__.py", "")
  _write(tmp_path, "pkg/sub/c.py", "import os\nfrom . import d\n")
  _write(tmp_path, "pkg/sub/d.py", "")
  graph = import_graph(str(tmp_path), "pkg")
  assert graph["pkg.a"] == {"pkg", "pkg.b", "pkg.sub", "pkg.sub.c"}
  assert graph["pkg.sub.c"] == {"pkg", "pkg.sub", "pkg.sub.d"}
  assert find_cycle(graph) is None
