"""Command-line flags shared by the ES benchmarks (one workload description for all of them)."""

from __future__ import annotations

import argparse

MODELS = ("tiny", "smollm2", "smollm2-random")
PRNGS = ("threefry2x32", "rbg", "unsafe_rbg")


def workload_parser(doc: str) -> argparse.ArgumentParser:
  """A parser with the model, prompt and ES-step flags; scripts add their own on top."""
  parser = argparse.ArgumentParser(
    description=doc.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="\n".join(doc.splitlines()[1:]),
  )
  parser.add_argument("--model", default="tiny", choices=MODELS)
  parser.add_argument("--prompts", type=int, default=4, help="P: prompts (the same for all)")
  parser.add_argument("--prompt_len", type=int, default=32, help="S: prompt length (random ids)")
  parser.add_argument(
    "--max_new_tokens", type=int, default=16, help="T: new tokens per completion (EOS off)"
  )
  parser.add_argument("--learning_rate", type=float, default=1e-3, help="α")
  parser.add_argument(
    "--prng",
    default="threefry2x32",
    choices=PRNGS,
    help="PRNG implementation of the step key (rbg draws full-rank noise faster on CPU)",
  )
  return parser


def load_model(name: str):
  """(Transformer, tokenizer or None) of a benchmark's ``--model``.

  ``tiny``: a random tiny-llama. ``smollm2``: the bundled SmolLM2-135M-Instruct
  (``load_default``). ``smollm2-random``: the same architecture with random weights, for
  machines without the bundled 98 MB GGUF (e.g. a lent accelerator); the timed work is the same
  because the benchmarks decode a fixed number of tokens.
  """
  from flax import nnx

  from es_jax.models import Transformer, get_config, load_default

  if name == "smollm2":
    return load_default()
  presets = {"tiny": "tiny-llama", "smollm2-random": "smollm2-135m"}
  if name not in presets:
    raise ValueError(f"--model={name!r}: use one of {MODELS}.")
  return Transformer(get_config(presets[name]), rngs=nnx.Rngs(0)), None
