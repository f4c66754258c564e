"""docs/architecture.md's module map follows the folders: every package and module of es_jax/ and
experiments/ is named there, and every folder it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
# Folders whose files the map describes in prose as a group rather than one by one.
GROUPED = {"configs", "benchmarks", "models", "rewards", "data", "fields"}


def _modules():
  for top in ("es_jax", "experiments"):
    for path in sorted((ROOT / top).rglob("*.py")):
      rel = path.relative_to(ROOT / top)
      if path.name == "__init__.py" or rel.parts[0] in GROUPED:
        continue
      yield top, rel


def test_every_module_is_in_the_module_map():
  missing = [f"{top}/{rel}" for top, rel in _modules() if f"`{rel.name}`" not in DOC]
  assert not missing, f"docs/architecture.md's module map does not name: {missing}"


def test_every_package_is_a_folder_of_the_map_and_every_folder_it_names_exists():
  packages = {
    f"{p.parent.relative_to(ROOT / top).as_posix()}/"
    for top in ("es_jax", "experiments")
    for p in (ROOT / top).glob("*/__init__.py")
  }
  named = set(re.findall(r"^- `([a-z_]+/)`", DOC, flags=re.M))
  assert packages - named == set(), f"folders missing from the map: {packages - named}"
  assert named - packages == set(), f"the map names folders that do not exist: {named - packages}"
