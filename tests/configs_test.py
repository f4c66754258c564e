"""The paper configs' defaults against the settings table of docs/method.md §10, parsed from the
doc, so that the doc and the configs cannot drift apart."""

import ast
import os
import re

import pytest

from experiments.configs import deepscaler_hard, gsm8k_easy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "method.md")
CONFIGS = {"gsm8k_easy.py": gsm8k_easy, "deepscaler_hard.py": deepscaler_hard}
# What the table must cover (a deleted row fails here, not silently).
REQUIRED = {
  "es.num_steps",
  "grpo.num_steps",
  "sequential.total_steps",
  "es.population_size",
  "es.sigma",
  "es.learning_rate",
  "data.prompts_per_step",
  "eval.task",
  "eval.extra_tasks",
  "es.max_new_tokens",
  "grpo.max_new_tokens",
  "eval.max_new_tokens",
  "es.temperature",
  "grpo.temperature",
  "eval.temperature",
  "eval.num_samples",
  "eval.ks",
}


def _doc_table(text: str) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the first table under '## §10'; line numbers in errors."""
  start = text.find("## §10")
  assert start >= 0, f"{DOC}: no '## §10' section"
  first_line = text[:start].count("\n") + 1
  lines = text[start:].splitlines()
  table = [(first_line + i, ln) for i, ln in enumerate(lines) if ln.startswith("|")]
  assert len(table) > 2, f"{DOC}:{first_line}: §10 has no table"
  cells = [(n, [c.strip() for c in ln.strip().strip("|").split("|")]) for n, ln in table]
  header = cells[0][1]
  for n, row in cells[2:]:
    assert len(row) == len(header), f"{DOC}:{n}: {len(row)} cells, the header has {len(header)}"
  return header, [row for _, row in cells[2:]]


def _value(cell: str):
  try:
    return ast.literal_eval(cell)
  except (ValueError, SyntaxError):
    return cell


def _get(config, dotted: str):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def _cases(text: str):
  header, rows = _doc_table(text)
  for column, name in enumerate(header):
    m = re.search(r"`(\w+\.py)`", name)
    if m:
      assert m.group(1) in CONFIGS, f"{DOC}: §10 column {name!r} names an unknown config"
      for row in rows:
        for field in re.findall(r"`([\w.]+)`", row[1]):
          yield m.group(1), field, row[column]


DOC_TEXT = open(DOC, encoding="utf-8").read()
CASES = list(_cases(DOC_TEXT))


def test_table_covers_both_configs_and_every_required_field():
  for config in CONFIGS:
    fields = {f for c, f, _ in CASES if c == config}
    assert REQUIRED <= fields, f"{DOC} §10 lacks {sorted(REQUIRED - fields)} for {config}"


def _mismatches(config_file: str, cases) -> list[str]:
  config = CONFIGS[config_file].get_config()
  wrong = []
  for name, field, cell in cases:
    if name != config_file:
      continue
    want, got = _value(cell), _get(config, field)
    if isinstance(want, tuple | list):
      same = isinstance(got, tuple | list) and list(got) == list(want)
    elif isinstance(want, float | int) and not isinstance(want, bool):
      same = isinstance(got, float | int) and got == pytest.approx(want, rel=1e-12)
    else:
      same = got == want
    if not same:
      wrong.append(f"{field}: {got!r} in the config, {cell!r} in {DOC} §10")
  return wrong


@pytest.mark.parametrize("config_file", sorted(CONFIGS))
def test_config_defaults_equal_the_doc_table(config_file):
  wrong = _mismatches(config_file, CASES)
  assert not wrong, f"{config_file}: " + "; ".join(wrong)


def test_a_changed_doc_cell_is_caught():
  row = next(ln for ln in DOC_TEXT.splitlines() if ln.startswith("| σ |"))
  doctored = DOC_TEXT.replace(row, row.replace("1.5e-3", "1e-3", 1))
  assert _mismatches("gsm8k_easy.py", list(_cases(doctored))) == [
    f"es.sigma: 0.0015 in the config, '1e-3' in {DOC} §10"
  ]
  bad = DOC_TEXT.replace(row, row + " extra |")
  with pytest.raises(AssertionError, match=r"method.md:\d+: 6 cells"):
    list(_cases(bad))
