"""Every config field is declared once (experiments.fields): base_config() and the declarations
hold the same fields, and no module below the declarations writes a field's default again."""

import ast
import glob
import os

from experiments import fields
from experiments.configs import base
from experiments.schema import check as config_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_leaves(config) -> dict:
  """{dotted name: value} of every field of a config: the top-level values and each group's."""
  out = {}
  for k, v in config.items():
    if k in fields.groups():
      out.update({f"{k}.{leaf}": value for leaf, value in v.items()})
    else:
      out[k] = v
  return {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in out.items()}


def test_every_config_field_is_declared_once():
  """base_config() and the declarations (experiments.fields) hold the same fields: none without a
  declaration, no declaration without a field; each at its declared default, which its rule
  accepts, with its help written; no group or field declared twice."""
  leaves = _config_leaves(base.base_config())
  declared = fields.declared()
  assert set(leaves) == set(declared)
  assert len(declared) > 100 and {"es.sigma", "report.pairs", "data.on_bad_row"} <= set(declared)
  for name, field in declared.items():
    assert leaves[name] == field.default and type(leaves[name]) is type(field.default), name
    assert field.rule(field.default) is None, name
    assert field.help.strip(), name
  assert len({id(g) for g in fields.groups().values()}) == len(fields.groups())
  assert len({id(f) for f in declared.values()}) == len(declared)
  assert config_check.schema() == {name: f.rule for name, f in declared.items()}


def _restated_defaults(path: str) -> list[str]:
  """The places in `path` that write a declared default again: `x.get("<field>", <its default>)`
  (a section read with a fallback of its own), or a dict or call holding two fields or more of
  one group at their defaults (a group's defaults copied)."""
  by_leaf = {}
  for name, field in fields.declared().items():
    by_leaf.setdefault(name.rpartition(".")[2], []).append((name, field.default))

  def same(node, name_default) -> bool:
    try:
      value = ast.literal_eval(node)
    except ValueError:
      return False
    return value == name_default[1] and type(value) is type(name_default[1])

  out = []
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
      key = node.args[0] if node.args else None
      if len(node.args) == 2 and isinstance(key, ast.Constant) and key.value in by_leaf:
        if any(same(node.args[1], nd) for nd in by_leaf[key.value]):
          out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    pairs = []
    if isinstance(node, ast.Call):
      pairs = [(kw.arg, kw.value) for kw in node.keywords if kw.arg]
    elif isinstance(node, ast.Dict):
      pairs = [
        (k.value, v)
        for k, v in zip(node.keys, node.values, strict=True)
        if isinstance(k, ast.Constant)
      ]
    hits = {}
    for key, value in pairs:
      for name, default in by_leaf.get(key, ()):
        if default not in ("", 0, False, True, None, (), {}) and same(value, (name, default)):
          hits.setdefault(name.rpartition(".")[0], []).append(key)
    out += [f"{path}:{node.lineno}: {g} {keys}" for g, keys in hits.items() if len(keys) >= 2]
  return out


def test_no_module_restates_a_declared_default(tmp_path):
  """Below the declarations nothing writes a field's default again (a fallback reads
  `fields.default(name)`); the config files (experiments/configs/) override values, and the
  benchmarks take their own arguments."""
  paths = [
    p
    for p in glob.glob(os.path.join(ROOT, "experiments", "**", "*.py"), recursive=True)
    if not any(f"{os.sep}{d}{os.sep}" in p for d in ("fields", "configs", "benchmarks"))
  ]
  assert len(paths) > 30
  found = [hit for p in sorted(paths) for hit in _restated_defaults(p)]
  assert not found, found
  # The check can fail: a copied fallback and a copied block are found.
  probe = tmp_path / "probe.py"
  probe.write_text(
    "a = cfg.get('arithmetic', 'fp32')\nb = dict(sigma=1.5e-3, learning_rate=2.5e-4)\n"
  )
  assert len(_restated_defaults(str(probe))) == 2
