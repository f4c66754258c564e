"""No import cycle among the `es_jax.*` and `experiments.*` modules.

Every module under es_jax/ and experiments/ is parsed with `ast` (nothing is imported), every
import statement is read, at module level, inside functions and under `if TYPE_CHECKING:` alike,
and the graph of imports between those modules must have no cycle. A cycle that is hidden by a
function-level import still couples the two modules, so it counts here too.

An edge goes to the module whose names are used: `from a.b import c` to `a.b.c` when c is a
submodule, else to `a.b` (c is defined in, or re-exported by, a.b); `import a.b` to `a.b`. The
parent packages Python initialises on the way are not edges: a package's __init__ that imports its
submodules (es_jax/__init__.py re-exports the public API) is not a cycle with them, but a submodule
that takes a name from its package's __init__ is.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("es_jax", "experiments")


def _module_files(root: str = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
  """{dotted module name: path} for every .py file under the packages (packages by __init__.py)."""
  out = {}
  for package in packages:
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
      # A submodule by name, or a name the module `base` defines (or re-exports).
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for name in names:
      # The longest known prefix: `import numpy` is none of ours, `from a.b import f` is a.b.
      parts = name.split(".")
      for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in known:
          if prefix != module:
            found.add(prefix)
          break
  return found


def import_graph(root: str = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
  """{module: the packages' modules it imports}."""
  files = _module_files(root, packages)
  graph = {}
  for module, path in files.items():
    with open(path, encoding="utf-8") as f:
      source = f.read()
    is_package = path.endswith("__init__.py")
    graph[module] = _imported(module, is_package, source, set(files))
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (depth-first search, sorted for a stable
  answer)."""
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


def test_library_and_experiments_have_no_import_cycle():
  graph = import_graph()
  assert len(graph) > 100 and "es_jax.data.files" in graph and "experiments.main" in graph
  assert "es_jax.data.prompts" in graph["es_jax.data.files"]  # edges found, not just nodes
  cycle = find_cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_imports_no_experiment_module():
  """es_jax is the library: it never reads an experiment config or calls a runner."""
  graph = import_graph()
  for module, targets in graph.items():
    if module.split(".")[0] == "es_jax":
      up = sorted(t for t in targets if t.split(".")[0] == "experiments")
      assert not up, f"{module} imports {up}"


def test_config_check_imports_no_runner():
  """config_check stands below the runners: it reads allowed values from the config layer."""
  graph = import_graph()
  runners = {  # full names, so that a move of these modules rewrites them here too
    "experiments.runners.es_runner",
    "experiments.runners.grpo_runner",
    "experiments.studies.demo",
    "experiments.studies.diversity",
    "experiments.runners.sequential",
    "experiments.studies.population_sweep",
    "experiments.runners.model_io",
  }
  assert runners <= set(graph), sorted(runners - set(graph))
  for module in ("experiments.schema.check", "experiments.schema.rules"):
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
  cycle = find_cycle(import_graph(str(tmp_path), ("pkg",)))
  assert cycle is not None and cycle[0] == cycle[-1]
  assert set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}


def test_no_cycle_in_a_chain(tmp_path):
  _write(tmp_path, "pkg/__init__.py", "from pkg.b import thing\n")  # re-exports, as es_jax does
  _write(tmp_path, "pkg/a.py", "from pkg import b\nimport pkg.sub.c\n")
  _write(tmp_path, "pkg/b.py", "from pkg.sub import c\nthing = 1\n")
  _write(tmp_path, "pkg/sub/__init__.py", "from pkg.sub import c, d\n")
  _write(tmp_path, "pkg/sub/c.py", "import os\nfrom . import d\n")
  _write(tmp_path, "pkg/sub/d.py", "")
  graph = import_graph(str(tmp_path), ("pkg",))
  assert graph["pkg"] == {"pkg.b"}
  assert graph["pkg.a"] == {"pkg.b", "pkg.sub.c"}
  assert graph["pkg.sub"] == {"pkg.sub.c", "pkg.sub.d"}
  assert graph["pkg.sub.c"] == {"pkg.sub.d"}
  assert find_cycle(graph) is None


def test_a_name_taken_from_the_package_init_is_a_cycle(tmp_path):
  """es_jax.data <-> es_jax.data.files was this shape: the package imports the submodule, and the
  submodule takes a class the package's __init__ defines (inside a function)."""
  _write(tmp_path, "pkg/__init__.py", "from pkg.files import load\nclass Examples: ...\n")
  _write(tmp_path, "pkg/files.py", "def load():\n  from pkg import Examples\n")
  assert find_cycle(import_graph(str(tmp_path), ("pkg",))) == ["pkg", "pkg.files", "pkg"]
