"""What each config field means, for `--help_config`: `describe(config)` lists every key with its
value, the values its rule allows and its help, all read from the field's one declaration
(`experiments.fields`)."""

from __future__ import annotations

from typing import Any

from experiments import fields


def field_docs() -> dict[str, str]:
  """{dotted name: help} of every declared field and group (`"es"`, `"es.sigma"`, ...)."""
  docs = {name: group.help for name, group in fields.groups().items()}
  docs.update({name: f.help for name, f in fields.declared().items()})
  return docs


def _allowed(field: fields.Field) -> str | None:
  """What the field's rule asks of a value it cannot accept (None for a rule that needs a real
  value to say it)."""
  try:
    return field.rule(object())
  except Exception:  # noqa: BLE001 - a rule that needs a real value: no hint
    return None


_SECTION = object()  # the value `_leaves` gives a group


def _is_section(value: Any) -> bool:
  return hasattr(value, "keys") and not isinstance(value, str)


def _leaves(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """(dotted name, value) of every group ("es", _SECTION) and field ("es.sigma", 1e-3) of `config`
  in order; a declared field holding a dict (e.g. data.task_config) is one field."""
  out = []
  for k in config.keys():
    dotted, value = prefix + k, config[k]
    if _is_section(value) and dotted not in fields.declared():
      out += [(dotted, _SECTION), *_leaves(value, dotted + ".")]
    else:
      out.append((dotted, value.to_dict() if hasattr(value, "to_dict") else value))
  return out


def describe(config: Any) -> str:
  """Every key of `config`: its value, what values are allowed and what it means (for
  `--help_config`); a key without a declaration is listed with its value only."""
  declared, docs = fields.declared(), field_docs()
  lines = []
  for dotted, value in _leaves(config):
    if value is _SECTION:
      lines += ["", f"{dotted}:" + (f"  # {docs[dotted]}" if docs.get(dotted) else "")]
      continue
    line = f"  {dotted} = {value!r}"
    if dotted in declared:
      need = _allowed(declared[dotted])
      line += f"  [{need}]" if need else ""
      line += f"  # {declared[dotted].help}"
    lines.append(line)
  return "\n".join(lines).lstrip("\n")
