"""Throughput of one GRPO step (rollout + update): es_jax against TRL's GRPOTrainer (PyTorch).

    python -m experiments.benchmarks.grpo_step [--model small|smollm2-135m|default]
        [--prompts 4] [--generations 4] [--max_new_tokens 32] [--micro_batch_size 4]
        [--steps 3] [--no_trl] [--torch_threads N]

One step = sample G completions for each of P prompts at temperature 1.0, score them on the host
(reward: fraction of vowels in the decoded completion), group advantages, then one AdamW step on
all B = P·G sequences with gradient accumulation over micro-batches (es_jax: mini_batch_size = B;
TRL: per_device_train_batch_size = micro, gradient_accumulation_steps = B / micro, so one
generation per optimizer step; β = 0, no reference model, the paper's per-sequence loss
aggregation). Both generate exactly max_new_tokens tokens per completion (EOS cannot stop a row:
es_jax samples without eos_ids, TRL gets min_new_tokens), fp32 on both sides, same checkpoint
(written with `save_hf`) and the same prompts.

Models: `small` (default) is a random Llama, d 256, 4 layers, SmolLM2's 49,152-token vocabulary
and tokenizer; `smollm2-135m` is SmolLM2-135M's shape with random weights; `default` is the real
SmolLM2-135M-Instruct (`load_default`). The first step of each side compiles / warms up and is
not timed. Prints completion tokens/s of the whole step, the share of the step spent generating,
and the ratio es_jax / TRL. TRL is optional: if it is not importable the comparison is skipped with
a note (it is not a project dependency; `pip install trl` adds it).

On a shared 2-core machine, torch's OpenMP threads degrade badly when the cores are oversubscribed
(measured here: HF `generate` 3-6 s with 2 threads vs 0.65 s with 1 thread under a load of 4), so
compare `--torch_threads 1` and the default before reading the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import jax
import numpy as np

from es_jax.decode.sampling import Decoding, pad_prompts
from es_jax.grpo import update as gt
from es_jax.models import Transformer, get_config, load_default, save_hf
from es_jax.models import params as model_params

PROMPTS = [
  "Count from one to ten:",
  "What is 7 + 8? Answer:",
  "List three prime numbers:",
  "The year after 1999 is",
  "Write a phone number:",
  "What is 12 times 3?",
  "Give the digits of pi:",
  "How many days are in a week?",
]


def vowel_reward(text: str) -> float:
  """Fraction of characters that are vowels: cheap, the same on both sides, and never constant
  over a group of random completions, so every step has non-zero advantages to train on."""
  return sum(c in "aeiouAEIOU" for c in text) / max(len(text), 1)


def load_model(name: str):
  """(model, tokenizer) for --model; random models use SmolLM2's tokenizer from the GGUF."""
  from flax import nnx

  if name == "default":
    return load_default()
  from es_jax.models.gguf_loader import default_tokenizer

  tokenizer = default_tokenizer()
  if name == "small":
    config = get_config(
      "smollm2-135m",
      hidden_size=256,
      num_layers=4,
      num_heads=4,
      num_kv_heads=2,
      intermediate_size=1024,
      head_dim=None,
    )
  elif name == "smollm2-135m":
    config = get_config("smollm2-135m")
  else:
    raise ValueError(f"--model={name!r}: use small, smollm2-135m or default.")
  return Transformer(config, rngs=nnx.Rngs(0)), tokenizer


def bench_es_jax(model, tokenizer, prompts, args) -> dict[str, float]:
  config = model.config
  G, T = args.generations, args.max_new_tokens
  ids, mask = pad_prompts(
    [tokenizer.encode(p, add_special_tokens=False) for p in prompts],
    pad_id=tokenizer.pad_token_id,
    bucket=1,
  )
  batch_rows = len(prompts) * G
  optimizer = gt.make_optimizer(1e-6)
  state = gt.init_state(model_params(model), optimizer)
  decoding = Decoding(T, temperature=1.0)
  settings = gt.UpdateSettings(batch_rows, args.micro_batch_size)
  key = jax.random.key(0)
  times = []
  for step in range(args.steps + 1):
    key, key_sample = jax.random.split(key)
    t0 = time.perf_counter()
    completions, batch = gt.rollout(
      state.params, ids, mask, config=config, key=key_sample, num_generations=G, decoding=decoding
    )
    tokens = np.asarray(jax.block_until_ready(completions.tokens))
    t1 = time.perf_counter()
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    rewards = np.array([vowel_reward(t) for t in texts], np.float32).reshape(-1, G)
    batch, _ = gt.with_advantages(batch, rewards)
    state, metrics = gt.update_step(
      state, batch, None, settings, config=config, optimizer=optimizer
    )
    jax.block_until_ready(state)
    t2 = time.perf_counter()
    if step:  # step 0 compiles
      times.append((t1 - t0, t2 - t0, int(np.asarray(completions.lengths).sum())))
    print(f"  es_jax step {step}: {t2 - t0:6.2f} s (generation {t1 - t0:5.2f} s)", flush=True)
  gen, total, tokens_generated = (np.sum([t[i] for t in times]) for i in range(3))
  return {"tok_s": tokens_generated / total, "gen_share": gen / total, "step_s": total / len(times)}


def _trl_config(grpo_config, out_dir: str, args, batch_rows: int, steps: int):
  """TRL's `GRPOConfig` for the same step as es_jax's: P·G rows of exactly T tokens sampled at
  temperature 1, no KL, group-scaled advantages, float32 on the CPU."""
  micro = args.micro_batch_size
  return grpo_config(
    output_dir=out_dir,
    per_device_train_batch_size=micro,
    gradient_accumulation_steps=batch_rows // micro,
    num_generations=args.generations,
    max_completion_length=args.max_new_tokens,
    generation_kwargs={"min_new_tokens": args.max_new_tokens},
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    beta=0.0,
    loss_type="grpo",
    scale_rewards="group",
    learning_rate=1e-6,
    max_steps=steps,
    bf16=False,
    gradient_checkpointing=False,
    use_cpu=True,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    shuffle_dataset=False,
    seed=0,
    disable_tqdm=True,
  )


def bench_trl(hf_dir, tokenizer, prompts, args) -> dict[str, float] | None:
  try:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
  except ImportError as e:
    print(f"NOTE: TRL comparison skipped ({e}); `pip install trl` to run it.")
    return None
  G, micro = args.generations, args.micro_batch_size
  batch_rows = len(prompts) * G
  if batch_rows % micro:
    raise ValueError(f"P·G={batch_rows} is not divisible by --micro_batch_size={micro}.")
  generation_time = [0.0]

  class TimedGRPOTrainer(GRPOTrainer):
    def _generate_single_turn(self, *a, **kw):
      t0 = time.perf_counter()
      out = super()._generate_single_turn(*a, **kw)
      generation_time[0] += time.perf_counter() - t0
      return out

  class StepTimer(TrainerCallback):
    def __init__(self):
      self.marks = []  # (wall time, generation time so far) at every optimizer step's end

    def on_train_begin(self, *a, **kw):
      self.marks.append((time.perf_counter(), generation_time[0]))

    def on_step_end(self, *a, **kw):
      self.marks.append((time.perf_counter(), generation_time[0]))
      print(
        f"  TRL    step {len(self.marks) - 2}: {self.marks[-1][0] - self.marks[-2][0]:6.2f} s "
        f"(generation {self.marks[-1][1] - self.marks[-2][1]:5.2f} s)",
        flush=True,
      )

  def reward(prompts, completions, **kwargs):
    return [vowel_reward(c) for c in completions]

  steps = args.steps + 1
  dataset = Dataset.from_dict({"prompt": [p for _ in range(steps) for p in prompts]})
  with tempfile.TemporaryDirectory() as out_dir:
    config = _trl_config(GRPOConfig, out_dir, args, batch_rows, steps)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    timer = StepTimer()
    trainer = TimedGRPOTrainer(
      model=model,
      reward_funcs=[reward],
      args=config,
      train_dataset=dataset,
      processing_class=tokenizer,
      callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts; the timer prints instead
    trainer.train()
  marks = np.array(timer.marks[1:])  # the first step (warm-up) is the first interval, dropped
  total, gen = marks[-1] - marks[0]
  lengths = [h["completions/mean_length"] for h in trainer.state.log_history[1:steps]]
  tokens_generated = float(np.sum(lengths)) * batch_rows
  return {"tok_s": tokens_generated / total, "gen_share": gen / total, "step_s": total / args.steps}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="small")
  parser.add_argument("--prompts", type=int, default=4)
  parser.add_argument("--generations", type=int, default=4)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--micro_batch_size", type=int, default=4)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--no_trl", action="store_true")
  parser.add_argument(
    "--torch_threads", type=int, default=None, help="torch.set_num_threads; default: torch's"
  )
  args = parser.parse_args(argv)
  warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes
  model, tokenizer = load_model(args.model)
  prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
  c = model.config
  print(
    f"jax {jax.__version__} on {jax.devices()[0].device_kind}; model {args.model} "
    f"({c.num_params() / 1e6:.1f}M params, {c.num_layers} layers, d {c.hidden_size}, vocab "
    f"{c.vocab_size}); P={args.prompts} G={args.generations} T={args.max_new_tokens} "
    f"micro={args.micro_batch_size}; {args.steps} timed steps after 1 warm-up",
    flush=True,
  )
  ours = bench_es_jax(model, tokenizer, prompts, args)
  print(
    f"es_jax: {ours['tok_s']:8.1f} completion tok/s, {ours['step_s']:6.2f} s/step, "
    f"generation {100 * ours['gen_share']:4.1f}% of the step",
    flush=True,
  )
  if args.no_trl:
    return
  import torch

  if args.torch_threads:
    torch.set_num_threads(args.torch_threads)
  print(f"torch {torch.__version__} with {torch.get_num_threads()} threads", flush=True)
  with tempfile.TemporaryDirectory() as hf_dir:
    save_hf(model, tokenizer, hf_dir)
    theirs = bench_trl(hf_dir, tokenizer, prompts, args)
  if theirs is None:
    return
  print(
    f"TRL:    {theirs['tok_s']:8.1f} completion tok/s, {theirs['step_s']:6.2f} s/step, "
    f"generation {100 * theirs['gen_share']:4.1f}% of the step"
  )
  print(f"ratio es_jax / TRL (tokens/s): {ours['tok_s'] / theirs['tok_s']:.2f}x")


if __name__ == "__main__":
  main()
