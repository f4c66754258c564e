"""The README's main job on the embedded default model (SmolLM2-135M-Instruct, offline).

    make demo        # or: python -m experiments.demo [--num_prompts 8] [--max_new_tokens 64]

Loads the bundled GGUF, asks it a few offline reasoning-gym problems (chain_sum: sums of two
one-digit numbers), prints each answer with its reward, and the decode throughput.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from es_jax import data, rewards
from es_jax.models import load_default
from es_jax.sampling import encode_prompts, generate

TASK = "reasoning_gym/chain_sum"
TASK_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num_prompts", type=int, default=8)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  args = parser.parse_args(argv)

  t0 = time.perf_counter()
  model, tok = load_default()
  print(f"loaded SmolLM2-135M-Instruct ({model.config.num_params() / 1e6:.1f}M params) "
        f"in {time.perf_counter() - t0:.1f}s on {jax.devices()[0].platform}")
  examples = data.load_task(TASK, "test", limit=args.num_prompts, task_config=TASK_CONFIG)
  texts = [data.format_prompt(ex, tok) for ex in examples]
  ids, mask = encode_prompts(tok, texts)
  reward = rewards.get_reward(TASK)
  kw = dict(key=jax.random.key(0), max_new_tokens=args.max_new_tokens,
            eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
  for label in ("compile + run", "run"):
    t0 = time.perf_counter()
    out = generate(model, ids, mask, **kw)
    jax.block_until_ready(out.tokens)
    seconds = time.perf_counter() - t0
    new_tokens = int(out.lengths.sum())
    print(f"{label}: {new_tokens} new tokens in {seconds:.2f}s "
          f"= {new_tokens / seconds:.1f} tokens/s (batch {ids.shape[0]}, greedy)")
  scores = []
  for i, ex in enumerate(examples):
    row = np.asarray(out.tokens[i])[np.asarray(out.mask[i])]
    answer = tok.decode(row, skip_special_tokens=True)
    scores.append(reward(answer, ex))
    print(f"\n[{i}] {ex['question']}\n  gold: {ex['answer']}  reward: {scores[-1]:.1f}\n"
          f"  model: {answer.strip()[:300]!r}")
  print(f"\nmean reward {np.mean(scores):.3f} over {len(scores)} problems")


if __name__ == "__main__":
  main()
