"""Answer extraction from untrusted completions: boxed, tagged, "####" and last-number answers.

Every function is linear in the completion length: one regex pass, and no pattern has two adjacent
quantifiers that can match the same characters (tests feed 1M-character adversarial inputs), so a
100k-character completion costs milliseconds; extracted answers longer than `MAX_ANSWER_CHARS` are
dropped (treated as no answer) before any parser sees them.
"""

import re

# Longest extracted answer handed to a parser; real answers are far shorter.
MAX_ANSWER_CHARS = 1000
# Deepest brace nesting handed to a parser (math-verify's LaTeX parser slows sharply beyond).
MAX_BRACE_DEPTH = 32

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"\\[{}]|[{}]")  # escaped braces (\{ \}) are literal, not grouping
_BOX_SPACE_RE = re.compile(r"\\boxed +([^\s$]+)")  # "\boxed 5" (no braces)
# Possessive `\s*+`: two adjacent plain `\s*` split a whitespace run in O(n^2) ways before failing
# ("####" + 16k spaces took 7-10 s); possessive runs never give characters back.
_HASH_RE = re.compile(r"####\s*+([-+]?\$?\s*+(?:[0-9][0-9,]*+(?:\.[0-9]++)?|\.[0-9]++))")
# re.ASCII: only 0-9 are digits (not e.g. full-width or Devanagari digits, which int() accepts).
# A sign only where it cannot be a binary minus ("5-3" ends in 3, not -3).
_NUMBER_RE = re.compile(r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?", re.ASCII)
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+", re.ASCII)


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
  last = None
  for match in pattern.finditer(text):
    last = match
  return last


def _matching_braces(text: str) -> dict[int, int]:
  """Map the index of each grouping '{' to its matching '}' in one pass (escapes skipped)."""
  stack: list[int] = []
  match: dict[int, int] = {}
  for m in _BRACE_RE.finditer(text):
    token = m.group()
    if token == "{":
      stack.append(m.start())
    elif token == "}" and stack:
      match[stack.pop()] = m.start()
  return match


def brace_depth(text: str) -> int:
  """Maximum nesting depth of grouping braces in `text`."""
  depth = best = 0
  for m in _BRACE_RE.finditer(text):
    if m.group() == "{":
      depth += 1
      best = max(best, depth)
    elif m.group() == "}":
      depth = max(depth - 1, 0)
  return best


def last_boxed(text: str) -> str | None:
  """Content of the last brace-matched `\\boxed{...}` or `\\fbox{...}` (nested braces kept).

  An unclosed last box (a truncated completion) is skipped in favour of the previous closed one.
  `\\boxed 5` without braces is accepted when no braced box exists. Returns None when there is no
  box or the content exceeds MAX_ANSWER_CHARS.
  """
  starts = [m.end() - 1 for m in _BOX_RE.finditer(text)]  # index of each box's '{'
  if starts:
    match = _matching_braces(text)
    for open_index in reversed(starts):
      if open_index in match:
        content = text[open_index + 1 : match[open_index]].strip()
        return content if len(content) <= MAX_ANSWER_CHARS else None
    return None
  spaced = _last_match(_BOX_SPACE_RE, text)
  if spaced is None or len(spaced.group(1)) > MAX_ANSWER_CHARS:
    return None
  return spaced.group(1).rstrip(".")


def last_tag(text: str, tag: str = "answer") -> str | None:
  """Stripped content of the last `<tag>...</tag>` pair, or None (also when too long)."""
  close = text.rfind(f"</{tag}>")
  if close < 0:
    return None
  open_ = text.rfind(f"<{tag}>", 0, close)
  if open_ < 0:
    return None
  content = text[open_ + len(tag) + 2 : close].strip()
  return content if len(content) <= MAX_ANSWER_CHARS else None


def hash_answer(text: str) -> str | None:
  """The number after the last GSM8K-style `####`, commas and `$` removed, or None."""
  found = _last_match(_HASH_RE, text)
  if found is None or len(found.group(1)) > MAX_ANSWER_CHARS:
    return None
  return found.group(1).replace(",", "").replace("$", "").replace(" ", "").rstrip(".")


def last_number(text: str) -> str | None:
  """The last number in `text` (e.g. '-1,234.5' -> '-1234.5'), or None.

  A fallback for weak models that answer in plain prose (measured: SmolLM2-135M boxes ~1% of
  the time). Only the last 10,000 characters are searched, which bounds the cost.
  """
  found = _last_match(_NUMBER_RE, text[-10_000:])
  if found is None:
    return None
  number = found.group().replace(",", "")
  return number if len(number) <= MAX_ANSWER_CHARS else None


def plain_number(answer: str) -> str | None:
  """`answer` as a canonical decimal string when it is just a number, else None.

  Accepts thousands separators (`1,234`, `1\\,234`), a leading `$` or `\\$`, surrounding `$...$`,
  spaces and a trailing period: '\\$1,234.' -> '1234'. Used for fast exact comparison and for
  normalising answers before majority voting.
  """
  s = answer.strip().strip("$").strip()
  s = re.sub(r"([0-9])(?:\\[,!;: ]|\{,\})([0-9])", r"\1\2", s)
  s = s.replace("\\$", "").replace("\\!", "").replace(" ", "").rstrip(".")
  if s.startswith("$"):
    s = s[1:]
  if not s or len(s) > 100 or not _PLAIN_NUMBER_RE.fullmatch(s):
    return None
  s = s.replace(",", "").lstrip("+")
  if "." in s:
    s = s.rstrip("0").rstrip(".") or "0"
  negative = s.startswith("-")
  digits = s.lstrip("-")
  if digits.startswith("."):
    digits = "0" + digits
  int_part, _, frac = digits.partition(".")
  int_part = int_part.lstrip("0") or "0"
  digits = f"{int_part}.{frac}" if frac else int_part
  return "0" if digits == "0" else ("-" if negative else "") + digits
