"""What each config field means, for `--help_config`: `field_docs()` reads the comments of
experiments/configs/base.py, `describe(config)` lists every key with its value, the values
`experiments.config_check.schema()` allows and that comment."""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from typing import Any

from experiments import config_check


@functools.cache
def field_docs() -> dict[str, str]:
  """{dotted key: its comment in experiments/configs/base.py}: the `# ...` on a field's line or
  the comment block just above it (above `c.<section> = dict(` for the section itself, or above
  `return dict(` in the helper of a `c.<section> = _<section>()`)."""
  from experiments.configs import base

  with open(base.__file__, encoding="utf-8") as f:
    source = f.read()
  comments = {
    tok.start[0]: tok.string.lstrip("#").strip()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline)
    if tok.type == tokenize.COMMENT
  }
  code_lines = source.splitlines()

  def doc(line: int) -> str:
    """The comment on `line` (after code), else the comment lines right above it."""
    if line in comments and not code_lines[line - 1].lstrip().startswith("#"):
      return comments[line]
    above, i = [], line - 1
    while i in comments and code_lines[i - 1].lstrip().startswith("#"):
      above.insert(0, comments[i])
      i -= 1
    return " ".join(above)

  out: dict[str, str] = {}
  functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
  for node in functions["base_config"].body:
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    target = node.targets[0]
    if not (isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "c"):
      continue
    out[target.attr] = doc(node.lineno)
    value = node.value
    helper = functions.get(getattr(getattr(value, "func", None), "id", ""))
    if helper is not None and isinstance(helper.body[-1], ast.Return):
      # `c.es = _es()`: the section is the dict its helper returns, the comment above it
      value = helper.body[-1].value
      out[target.attr] = out[target.attr] or doc(helper.body[-1].lineno)
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "dict":
      for kw in value.keywords:
        if kw.arg:
          out[f"{target.attr}.{kw.arg}"] = doc(kw.value.lineno)
  return out


def describe(config: Any) -> str:
  """Every key of `config`: its value, what values are allowed and what it means (for
  `--help_config`)."""
  rules, docs = config_check.schema(), field_docs()
  lines = []
  for dotted in config_check.all_fields(config):
    value = config
    for part in dotted.split("."):
      value = value[part]
    section = hasattr(value, "keys") and not isinstance(value, str)
    if section:
      lines += ["", f"{dotted}:" + (f"  # {docs[dotted]}" if docs.get(dotted) else "")]
      continue
    line = f"  {dotted} = {value!r}"
    if dotted in rules:
      try:
        need = rules[dotted](object())  # what the rule asks of a value it cannot accept
      except Exception:  # noqa: BLE001 - a rule that needs a real value: no hint
        need = None
      if need:
        line += f"  [{need}]"
    parent = dotted.rpartition(".")[0]
    if docs.get(dotted) and docs[dotted] != docs.get(parent):
      line += f"  # {docs[dotted]}"
    lines.append(line)
  return "\n".join(lines).lstrip("\n")
