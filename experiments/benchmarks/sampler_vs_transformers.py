"""Greedy decoding throughput: es_jax's sampler against transformers' `generate` (PyTorch).

    python -m experiments.benchmarks.sampler_vs_transformers [--batch_sizes 1,16]
        [--new_tokens 64] [--models smollm2,tiny] [--repeats 2] [--torch_device cpu|cuda]

The same checkpoint (SmolLM2-135M-Instruct dequantised from the bundled GGUF and written as an
HF directory with `save_hf`; `smollm2-random`, the same architecture with random weights, where
the GGUF is not at hand; and a small random Llama) is decoded greedily by both, from the same
left-padded prompts, for exactly `new_tokens` tokens (EOS disabled in both so the work is equal).
Prints tokens/s of each, the ratio, and whether the generated tokens are identical (fp32 on both
sides; a greedy near-tie can flip a token late in a sequence, so the first mismatch is reported).
Each line ends with the 1-minute load average: other processes on the CPUs slow both sides, and
PyTorch's OpenMP threads much more than XLA's, so ratios measured on a busy machine are inflated.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import numpy as np

from es_jax.decode.sampling import Decoding, generate, pad_prompts
from es_jax.models import Transformer, get_config, save_hf
from experiments.benchmarks._common import load_model

QUESTIONS = [
  "What is the capital of France?",
  "What is 7 + 8? Explain briefly.",
  "Name three primary colours.",
  "Write one sentence about the sea.",
  "What is 12 times 3?",
  "Why is the sky blue?",
  "Give a synonym for happy.",
  "What is the largest planet?",
]


def _prompts(tokenizer, batch: int, vocab: int):
  if tokenizer is None:
    rng = np.random.RandomState(0)
    return [list(rng.randint(0, vocab, 8 + 3 * (i % 5))) for i in range(batch)]
  msgs = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch)]
  return [
    tokenizer.encode(
      tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
      add_special_tokens=False,
    )
    for m in msgs
  ]


def _timed(fn, repeats: int):
  best = float("inf")
  out = None
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t0)
  return out, best


def bench_one(name, model, tokenizer, batch, new_tokens, repeats, hf_dir, torch_device="cpu"):
  import torch
  from transformers import AutoModelForCausalLM

  pad_id = tokenizer.pad_token_id if tokenizer is not None else 0
  ids, mask = pad_prompts(
    _prompts(tokenizer, batch, model.config.vocab_size), pad_id=pad_id, bucket=8
  )

  def run_jax():
    out = generate(model, ids, mask, Decoding(new_tokens), key=jax.random.key(0))
    return np.asarray(jax.block_until_ready(out.tokens))

  run_jax()  # compile
  ours, t_ours = _timed(run_jax, repeats)

  hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval().to(torch_device)
  hf.generation_config.eos_token_id = None
  hf.generation_config.pad_token_id = pad_id

  def run_hf():
    with torch.inference_mode():
      out = hf.generate(
        input_ids=torch.tensor(ids, dtype=torch.long, device=torch_device),
        attention_mask=torch.tensor(mask.astype(np.int64), device=torch_device),
        max_new_tokens=new_tokens,
        do_sample=False,
      )
    return out[:, ids.shape[1] :].cpu().numpy()

  run_hf()  # warm-up
  theirs, t_hf = _timed(run_hf, repeats)
  same = ours.shape == theirs.shape and bool((ours == theirs).all())
  first = "" if same else f" first mismatch at token {int(np.argmax((ours != theirs).any(0)))}"
  n = batch * new_tokens
  print(
    f"{name:8s} batch {batch:3d}: es_jax {n / t_ours:8.1f} tok/s  transformers "
    f"{n / t_hf:8.1f} tok/s  ratio {t_hf / t_ours:5.2f}x  identical={same}{first}  "
    f"(load {os.getloadavg()[0]:.1f})",
    flush=True,
  )
  return t_hf / t_ours


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_sizes", default="1,16")
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--models", default="smollm2,tiny")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--torch_device", default="cpu", help="where transformers runs (cpu, cuda)")
  args = parser.parse_args(argv)
  import torch
  from flax import nnx

  print(
    f"jax {jax.__version__} on {jax.devices()[0].device_kind}; torch {torch.__version__} "
    f"with {torch.get_num_threads()} threads; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
  )
  for name in args.models.split(","):
    if name in ("smollm2", "smollm2-random"):
      model, tok = load_model(name)
    elif name == "tiny":  # larger than _common's tiny, so the timings mean something
      cfg = get_config(
        "tiny-llama",
        hidden_size=256,
        num_layers=4,
        intermediate_size=768,
        num_heads=8,
        num_kv_heads=4,
      )
      model, tok = Transformer(cfg, rngs=nnx.Rngs(0)), None
    else:
      raise ValueError(f"--models: unknown model {name!r} (smollm2, smollm2-random, tiny)")
    with tempfile.TemporaryDirectory() as hf_dir:
      save_hf(model, tok, hf_dir)
      for b in (int(x) for x in args.batch_sizes.split(",")):
        bench_one(name, model, tok, b, args.new_tokens, args.repeats, hf_dir, args.torch_device)


if __name__ == "__main__":
  main()
