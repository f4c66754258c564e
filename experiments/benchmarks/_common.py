"""Command-line flags shared by the ES benchmarks (one workload description for all of them)."""

from __future__ import annotations

import argparse

MODELS = ("tiny", "smollm2")
PRNGS = ("threefry2x32", "rbg", "unsafe_rbg")


def workload_parser(doc: str) -> argparse.ArgumentParser:
  """A parser with the model, prompt and ES-step flags; scripts add their own on top."""
  parser = argparse.ArgumentParser(
    description=doc.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="\n".join(doc.splitlines()[1:]),
  )  # fmt: skip
  parser.add_argument("--model", default="tiny", choices=MODELS)
  parser.add_argument("--prompts", type=int, default=4, help="P: prompts (the same for all)")
  parser.add_argument("--prompt_len", type=int, default=32, help="S: prompt length (random ids)")
  parser.add_argument(
    "--max_new_tokens", type=int, default=16, help="T: new tokens per completion (EOS off)"
  )
  parser.add_argument("--learning_rate", type=float, default=1e-3, help="α")
  parser.add_argument(
    "--prng", default="threefry2x32", choices=PRNGS,
    help="PRNG implementation of the step key (rbg draws full-rank noise faster on CPU)",
  )  # fmt: skip
  return parser
