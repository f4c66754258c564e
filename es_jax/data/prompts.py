"""Prompts: the paper's system prompt, per-task answer-format instructions, chat formatting.

The user message is the example's "prompt" followed by the task's instruction, which tells the
model the answer format its reward reads (es_jax.rewards): math and reasoning-gym answers in
\\boxed{}, multiple-choice letters in \\boxed{}, Countdown equations and HotpotQA answers in
<answer></answer> tags, MBPP code in a ```python block. The default system prompt is the paper's
for boxed tasks, and a plain "reason step by step" for the tag and code tasks, so that the system
and user messages never ask for two different answer formats.
"""

from __future__ import annotations

from typing import Any

from es_jax.data import formats

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_SYSTEM_PROMPT = "Please reason step by step."

COUNTDOWN_INSTRUCTION = (
  "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
  "tags, for example <answer> (1 + 2) / 3 </answer>."
)
CHOICE_INSTRUCTION = (
  "Answer with the letter of the correct option within \\boxed{}, for example \\boxed{A}."
)
HOTPOTQA_INSTRUCTION = "Give the final short answer (a few words) in <answer> </answer> tags."
MBPP_INSTRUCTION = "Write your complete solution in a single ```python code block."

INSTRUCTIONS = {
  "countdown": COUNTDOWN_INSTRUCTION,
  "hotpotqa": HOTPOTQA_INSTRUCTION,
  "mbpp": MBPP_INSTRUCTION,
  **{task: CHOICE_INSTRUCTION for task in formats.MULTIPLE_CHOICE_TASKS},
}
_PLAIN_SYSTEM_TASKS = ("countdown", "hotpotqa", "mbpp")
# Reward name (es_jax.rewards) -> (system prompt, answer-format instruction) of a question/answer
# file's prompt, so that the model is asked for the format its reward reads. A reward not listed
# (a user's "module:function") gets the plain system prompt and no instruction.
REWARD_PROMPTS = {
  "math": (SYSTEM_PROMPT, ""),
  "gsm8k": (SYSTEM_PROMPT, ""),
  "reasoning_gym": (SYSTEM_PROMPT, ""),
  "char_parity": (SYSTEM_PROMPT, ""),
  "choice": (SYSTEM_PROMPT, CHOICE_INSTRUCTION),
  "qa": (PLAIN_SYSTEM_PROMPT, HOTPOTQA_INSTRUCTION),
  "code": (PLAIN_SYSTEM_PROMPT, MBPP_INSTRUCTION),
  "countdown": (PLAIN_SYSTEM_PROMPT, COUNTDOWN_INSTRUCTION),
}


def reward_prompts(reward: str) -> tuple[str, str]:
  """(system prompt, instruction) asking for the answer format `reward` reads."""
  return REWARD_PROMPTS.get(reward, (PLAIN_SYSTEM_PROMPT, ""))


def default_system_prompt(task: str) -> str:
  """The system prompt for `task` when the caller does not choose one."""
  return PLAIN_SYSTEM_PROMPT if task in _PLAIN_SYSTEM_TASKS else SYSTEM_PROMPT


def build_messages(
  example: dict[str, Any], *, system_prompt: str | None = None, instruction: str | None = None
) -> list[dict[str, str]]:
  """Chat messages for one example.

  Args:
    example: an example from `load_task` ("prompt" and "task" are read).
    system_prompt: None for the example's "system_prompt" field or else the task's default, ""
      for no system message, or the text to use.
    instruction: None for the example's "instruction" field or else the task's answer-format
      instruction (`INSTRUCTIONS`; none for math tasks), "" for none, or the text to append to
      the user message.

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}] (no system message when it is empty).
  """
  task = example.get("task", "")
  if "prompt" not in example:
    raise KeyError(f"example {example.get('id', '?')!r} of task {task!r} has no 'prompt' field")
  if system_prompt is None:
    system_prompt = example.get("system_prompt", default_system_prompt(task))
  if instruction is None:
    instruction = example.get("instruction", INSTRUCTIONS.get(task, ""))
  system, suffix = system_prompt, instruction
  user = f"{example['prompt']}\n\n{suffix}" if suffix else example["prompt"]
  messages = [{"role": "system", "content": system}] if system else []
  return [*messages, {"role": "user", "content": user}]


def plain_prompt(messages: list[dict[str, str]]) -> str:
  """The fallback without a chat template: messages separated by blank lines, then a newline."""
  return "\n\n".join(m["content"] for m in messages) + "\n"


def format_prompt(
  example: dict[str, Any],
  tokenizer: Any = None,
  *,
  system_prompt: str | None = None,
  instruction: str | None = None,
  chat_template: str | None = None,
) -> str:
  """The text to feed the model for one example, ending where the assistant's answer starts.

  An example holding "prompt_text" (a question/answer file's `prompt_template`, filled) is fed
  as that text, without chat template. Otherwise uses
  `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`.
  Templates that reject a system role get the system prompt prepended to the user message.
  Without a tokenizer, or with one that has no chat template, returns `plain_prompt`.

  Args:
    example: an example from `load_task`.
    tokenizer: a transformers tokenizer, or None.
    system_prompt: see `build_messages`.
    instruction: see `build_messages`.
    chat_template: a Jinja chat template overriding the tokenizer's own.

  Returns:
    The prompt string (not tokenized).
  """
  if example.get("prompt_text") is not None:
    return example["prompt_text"]
  messages = build_messages(example, system_prompt=system_prompt, instruction=instruction)
  template = chat_template or getattr(tokenizer, "chat_template", None)
  if tokenizer is None or not template:
    return plain_prompt(messages)
  try:
    return _apply(tokenizer, messages, template)
  except Exception as e:  # jinja2 raises TemplateError subclasses; transformers may wrap them.
    if messages[0]["role"] != "system" or "system" not in str(e).lower():
      raise
  merged = f"{messages[0]['content']}\n\n{messages[1]['content']}"
  return _apply(tokenizer, [{"role": "user", "content": merged}], template)


def _apply(tokenizer: Any, messages: list[dict[str, str]], template: str) -> str:
  text = tokenizer.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=True, chat_template=template
  )
  if not isinstance(text, str):
    raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
  return text
