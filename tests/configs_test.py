"""The paper configs' defaults against the settings table of docs/method.md §10, parsed from the
doc, so that the doc and the configs cannot drift apart."""

import ast
import os
import re

import pytest

from experiments.configs import base, deepscaler_hard, gsm8k_easy
from experiments.schema import check as config_check
from experiments.tpu import programs as tpu_programs

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


def _doc_table(text: str, heading: str = "## §10 ") -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the first table under `heading`; line numbers in errors."""
  start = text.find(heading)
  assert start >= 0, f"{DOC}: no {heading.strip()!r} section"
  first_line = text[:start].count("\n") + 1
  lines = text[start:].splitlines()
  table = []
  for i, ln in enumerate(lines):
    if ln.startswith("|"):
      table.append((first_line + i, ln))
    elif table:
      break  # the first table ends at its first non-table line
  assert len(table) > 2, f"{DOC}:{first_line}: {heading.strip()} has no table"
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


def _same(want, got) -> bool:
  if isinstance(want, tuple | list):
    return isinstance(got, tuple | list) and list(got) == list(want)
  if isinstance(want, float | int) and not isinstance(want, bool):
    return isinstance(got, float | int) and got == pytest.approx(want, rel=1e-12)
  return got == want


def _mismatches(config_file: str, cases) -> list[str]:
  config = CONFIGS[config_file].get_config()
  wrong = []
  for name, field, cell in cases:
    if name != config_file:
      continue
    got = _get(config, field)
    if not _same(_value(cell), got):
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


# --- the model, population-sweep and forgetting variants (docs/method.md §10.1, §10.2) ---

EASY_MODELS = sorted(gsm8k_easy.MODELS)
VARIANTS = {
  "gsm8k_easy.py": [
    "smoke",
    "sweep",
    "sweep_smoke",
    "forgetting",
    *EASY_MODELS,
    *(f"{m}_smoke" for m in EASY_MODELS),
    *(f"{m}_forgetting" for m in EASY_MODELS),
    *(f"{m}_sweep" for m in gsm8k_easy.SWEEP_MODELS),
  ],
  "deepscaler_hard.py": ["smoke", "forgetting"],
}
ALL_VARIANTS = [(f, v) for f, vs in VARIANTS.items() for v in vs]


def _variant_rows(heading: str) -> list[tuple[str, str, dict[str, str]]]:
  """(config file, variant, {field: cell}) of the table under `heading`."""
  header, rows = _doc_table(DOC_TEXT, heading)
  fields = {i: re.fullmatch(r"`([\w.]+)`", h) for i, h in enumerate(header)}
  out = []
  for row in rows:
    m = re.fullmatch(r"`(\w+\.py)(?::([\w.-]+))?`", row[0])
    assert m and m.group(1) in CONFIGS, f"{DOC} {heading}: bad variant cell {row[0]!r}"
    cells = {f.group(1): row[i] for i, f in fields.items() if f}
    out.append((m.group(1), m.group(2), cells))
  return out


@pytest.mark.parametrize("config_file, variant", ALL_VARIANTS)
def test_every_variant_builds_and_validates(config_file, variant):
  config = CONFIGS[config_file].get_config(variant)
  config_check.validate(config)
  assert config.method in base.METHODS


@pytest.mark.parametrize("heading", ["### §10.1 ", "### §10.2 "])
def test_variant_tables_equal_the_configs(heading):
  rows = _variant_rows(heading)
  assert rows, f"{DOC}: {heading.strip()} has no rows"
  wrong = []
  for config_file, variant, cells in rows:
    config = CONFIGS[config_file].get_config(variant)
    for field, cell in cells.items():
      got = _get(config, field)
      want = cell if isinstance(got, str) else _value(cell)  # "8,16,32,64" stays a string
      if not _same(want, got):
        wrong.append(f"{config_file}:{variant} {field}: {got!r} in the config, {cell!r} in the doc")
  assert not wrong, "; ".join(wrong)


def test_variant_tables_cover_every_model_sweep_and_forgetting():
  models = {v for f, v, _ in _variant_rows("### §10.1 ") if f == "gsm8k_easy.py"}
  assert set(EASY_MODELS) <= models
  assert {f"{m}_sweep" for m in gsm8k_easy.SWEEP_MODELS} <= models
  forgetting = {(f, v) for f, v, _ in _variant_rows("### §10.2 ")}
  assert forgetting == {(f, "forgetting") for f in CONFIGS}


@pytest.mark.parametrize("model", EASY_MODELS)
def test_model_variants_name_their_architecture(model):
  config = gsm8k_easy.get_config(model)
  # Without a local config.json the path's basename picks the preset (experiments.tpu.programs).
  got = tpu_programs.model_config_for(config.model)
  from es_jax import models

  assert got == models.get_config(model).replace(dtype=got.dtype)


def test_sweep_variants_are_the_papers_grid():
  for model in gsm8k_easy.SWEEP_MODELS:
    config = gsm8k_easy.get_config(f"{model}_sweep")
    assert config.method == "population_sweep"
    assert config.population_sweep.sizes == "8,16,32,64"
    assert config.population_sweep.tolerance == 0.01 and config.es.num_steps == 300
    assert config.model.path == gsm8k_easy.MODELS[model]
  assert gsm8k_easy.get_config("sweep").model.path == gsm8k_easy.MODELS["qwen2.5-1.5b"]
  with pytest.raises(ValueError, match="sweeps N only"):
    gsm8k_easy.get_config("qwen2.5-7b_sweep")


def test_hard_steps_are_one_epoch_of_deepscaler():
  hard = deepscaler_hard.get_config()
  assert hard.data.limit == 40315  # DeepScaleR-Preview's problems
  epoch = -(-hard.data.limit // hard.data.prompts_per_step)  # ceil: the last step wraps
  assert epoch == 630
  assert hard.es.num_steps == hard.grpo.num_steps == hard.sequential.total_steps == epoch


def test_hard_default_eval_is_the_math_average_and_forgetting_is_held_out_only():
  hard = deepscaler_hard.get_config()
  tasks = [hard.eval.task, *(t["task"] for t in hard.eval.extra_tasks)]
  assert tasks == ["math500", "aime24", "aime25", "amc23"]
  assert {t["task"]: t["limit"] for t in hard.eval.extra_tasks}["amc23"] == 40
  math = {"gsm8k", "math500", "aime24", "aime25", "amc23"}
  held_out = {
    "gsm8k_easy.py": ["csqa", "hotpotqa", "gpqa", "mbpp", "countdown"],  # Easy: all five
    "deepscaler_hard.py": ["csqa", "gpqa", "mbpp", "countdown"],  # Hard: no HotpotQA
  }
  for config_file in CONFIGS:
    c = CONFIGS[config_file].get_config("forgetting")
    tasks = [c.eval.task] + [t["task"] for t in c.eval.extra_tasks]
    assert tasks == held_out[config_file], config_file
    assert not math & set(tasks) and c.method == "evaluate"
    # The forgetting average is the setting's whole held-out list (paper Tables 5 and 10).
    assert all(t.get("average", True) for t in c.eval.extra_tasks)


@pytest.mark.parametrize(
  "config_file, variant",
  [
    ("gsm8k_easy.py", "bogus"),
    ("gsm8k_easy.py", "smoke_qwen2.5-3b"),
    ("gsm8k_easy.py", "forgetting_smoke"),
    ("deepscaler_hard.py", "qwen2.5-3b"),
    ("deepscaler_hard.py", "forgetting_smoke"),
  ],
)
def test_unknown_variants_are_refused(config_file, variant):
  with pytest.raises(ValueError, match=config_file):
    CONFIGS[config_file].get_config(variant)
