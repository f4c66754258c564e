"""The code sandbox's wire format (es_jax.rewards.code and its judge, `_sandbox_judge.py`).

The judge's config, the request (program, setup, tests), the verdict and every message between
the judge and the program process are one value each in the small codec below (`dumps`/`loads`):
plain data only, parsed by hand, so nothing the program sends is ever evaluated. Messages over a
pipe are length-prefixed (`write_message`/`read_message`). Standard library only: the judge runs
as `python -I -S` and loads this file by path.
"""

import os

MAX_MESSAGE = 8 << 20
_MAX_DEPTH = 100

# One value per message: N None, T/F bools, i<hex>; int, f<repr>; float, c<re>,<im>; complex,
# b<hex>; bytes, h<id>; handle, s<n>:<n chars> str, and l/t/S/z/d<n>: list, tuple, set,
# frozenset, dict (n items, or n key-value pairs). Exact types only: subclasses are handles.


def dumps(value, handle) -> str:
  """`value` as codec text; `handle(obj)` gives the id of anything that is not plain data."""
  out = []
  _dump(value, handle, out, 0)
  return "".join(out)


def _dump(value, handle, out, depth):
  kind = type(value)
  if value is None:
    out.append("N")
  elif kind is bool:
    out.append("T" if value else "F")
  elif kind is int:
    out.append(f"i{value:#x};")
  elif kind is float:
    out.append(f"f{value!r};")
  elif kind is str:
    out.append(f"s{len(value)}:{value}")
  elif kind is complex:
    out.append(f"c{value.real!r},{value.imag!r};")
  elif kind is bytes:
    out.append(f"b{value.hex()};")
  elif kind in (list, tuple, set, frozenset, dict) and depth < _MAX_DEPTH:
    tag = {list: "l", tuple: "t", set: "S", frozenset: "z", dict: "d"}[kind]
    out.append(f"{tag}{len(value)}:")
    for item in value.items() if kind is dict else value:
      for part in item if kind is dict else (item,):
        _dump(part, handle, out, depth + 1)
  else:
    out.append(f"h{int(handle(value))};")


def loads(text: str, resolve=None):
  """The value in codec text; `resolve(id)` turns a handle into an object (None: refused)."""
  value, end = _load(text, 0, resolve, 0)
  if end != len(text):
    raise ValueError("codec: trailing data")
  return value


def _load(text, i, resolve, depth):
  if depth > _MAX_DEPTH + 1:
    raise ValueError("codec: nested too deeply")
  tag, i = text[i], i + 1
  if tag in "NTF":
    return {"N": None, "T": True, "F": False}[tag], i
  if tag in "ifcbh":
    end = text.index(";", i)
    body, i = text[i:end], end + 1
    if tag == "i":
      return int(body, 16), i
    if tag == "f":
      return float(body), i
    if tag == "c":
      real, imag = body.split(",")
      return complex(float(real), float(imag)), i
    if tag == "b":
      return bytes.fromhex(body), i
    if resolve is None:
      raise ValueError("codec: unexpected handle")
    return resolve(int(body)), i
  if tag not in "sltSzd":
    raise ValueError(f"codec: bad tag {tag!r}")
  end = text.index(":", i)
  count, i = int(text[i:end]), end + 1
  if not 0 <= count <= len(text) - i:
    raise ValueError("codec: bad length")
  if tag == "s":
    return text[i : i + count], i + count
  items = []
  for _ in range(2 * count if tag == "d" else count):
    item, i = _load(text, i, resolve, depth + 1)
    items.append(item)
  if tag == "d":
    return dict(zip(items[::2], items[1::2], strict=True)), i
  return {"l": list, "t": tuple, "S": set, "z": frozenset}[tag](items), i


def write_message(fd: int, text: str) -> None:
  """One length-prefixed message (blocking fd)."""
  data = text.encode("utf-8", "surrogatepass")
  data = memoryview(b"%d\n" % len(data) + data)
  while data:
    data = data[os.write(fd, data) :]


def read_message(fd: int) -> str | None:
  """One message from a blocking fd; None at end of file."""
  buffer = b""
  while b"\n" not in buffer:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return None
    buffer += chunk
  size, _, data = buffer.partition(b"\n")
  size = int(size)
  if size > MAX_MESSAGE:
    raise ValueError("message too large")
  while len(data) < size:
    chunk = os.read(fd, min(1 << 20, size - len(data)))
    if not chunk:
      return None
    data += chunk
  return data.decode("utf-8", "surrogatepass")


def no_handle(value):
  """The `handle` of `dumps` where only plain data may go: refuses anything else."""
  raise TypeError(f"cannot pass a {type(value).__name__} to the program")
