"""GRPO: group-relative advantages, the clipped surrogate loss, and per-token log-probabilities.

GRPO (DeepSeekMath, arXiv 2402.03300; docs/method.md §3) samples G completions per prompt and gives
each token the completion's reward relative to its group as advantage, then minimises a PPO-style
clipped surrogate plus an optional k3 KL penalty to a frozen reference policy.

Axis letters: P prompts, G generations per prompt (one group), B sequences (B = P·G for a whole
rollout), T completion tokens, S prompt + completion tokens, V vocabulary, K chunks of C positions.

Sign convention: rewards and advantages are maximised; `grpo_loss` is a loss, to be minimised.
Every function here is pure and jittable; string options are structural and must be static under
`jax.jit`, numeric ones (`eps`, `temperature`, the leaves of `LossSettings`) may be traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from es_jax import _checks
from es_jax.es import fitness

STD_MODES = ("population", "unbiased", None)
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "dr_grpo")


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class LossSettings:
  """The clip, KL and normalisation settings of `grpo_loss`, one value, validated on construction
  (concrete values only; the message starts with the field: ``LossSettings.eps_low=1.5 must ...``).
  A pytree, as `es_jax.decode.sampling.Decoding`: ``eps_low``, ``eps_high`` and ``beta`` are its
  leaves, which may be traced (a new value does not recompile); ``aggregation`` is static.

  Attributes:
    eps_low, eps_high: clip widths, eps_low in [0, 1) (DAPO's clip-higher: eps_high > eps_low).
    beta, aggregation: the k3 KL penalty's weight, >= 0; one of `AGGREGATIONS` (see `grpo_loss`).
  """

  eps_low: float | jax.Array = 0.2
  eps_high: float | jax.Array = 0.2
  beta: float | jax.Array = 0.0
  aggregation: str = "seq_mean_token_mean"

  def __post_init__(self):
    name = type(self).__name__
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"{name}.aggregation={self.aggregation!r} is not one of {AGGREGATIONS}.")
    beta, lo, hi = (_checks.concrete_float(x) for x in (self.beta, self.eps_low, self.eps_high))
    if beta is not None and not beta >= 0.0:
      raise ValueError(f"{name}.beta={beta} must be >= 0 (the weight of the KL penalty).")
    if lo is not None and not 0.0 <= lo < 1.0:
      raise ValueError(f"{name}.eps_low={lo} must be in [0, 1) (ratio clipped at 1 - eps_low).")
    if hi is not None and not hi >= 0.0:
      raise ValueError(f"{name}.eps_high={hi} must be >= 0 (ratio clipped at 1 + eps_high).")

  def tree_flatten(self):
    return (self.eps_low, self.eps_high, self.beta), (self.aggregation,)

  @classmethod
  def tree_unflatten(cls, static, leaves):
    out = object.__new__(cls)  # no validation: leaves may be tracers or abstract values here
    names = ("aggregation", "eps_low", "eps_high", "beta")
    vars(out).update(zip(names, (*static, *leaves), strict=True))
    return out


def group_advantages(
  rewards: jax.Array, *, std: str | None = "population", eps: float = 1e-4
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Group-relative advantages of G completions per prompt.

  Â_{p,i} = (r_{p,i} − r̄_p) / (s_p + eps),  r̄_p = (1/G) Σ_i r_{p,i},  with s_p chosen by `std`:

  - "population": s_p = sqrt((1/G) Σ_i (r_{p,i} − r̄_p)²), the paper's choice (docs/method.md §3).
  - "unbiased": s_p = sqrt((1/(G−1)) Σ_i (r_{p,i} − r̄_p)²), Bessel-corrected (TRL, with eps=1e-4).
  - None: no division, Â_{p,i} = r_{p,i} − r̄_p (Dr.GRPO, arXiv 2503.20783); `eps` is unused.

  A group whose rewards are all equal carries no learning signal: its advantages are exactly 0,
  whatever the rounding of r̄_p. A non-finite reward (NaN, ±inf) ranks worst in its group, as in
  ES (es_jax.es.fitness): it is replaced by that group's min_finite − gap before centring, so the
  advantages stay finite; a group with no finite reward gets zero advantages.

  Args:
    rewards: [P, G] rewards, one row per prompt, one column per generation.
    std: which group standard deviation divides the centred rewards (see above).
    eps: added to s_p before dividing; guards groups with a tiny spread.

  Returns:
    (advantages [P, G] float32, stats) where stats holds float32 scalars: `reward_mean`,
    `reward_std` (population std over all rewards), `group_std_mean` (mean of s_p; the population
    std when `std` is None), `advantage_abs_mean`, and `frac_reward_zero_std` (the fraction of
    groups with all-equal rewards, i.e. zero advantage).

  Raises:
    ValueError: rewards not 2-D, G < 2, an unknown `std`, or a negative concrete `eps`.
  """
  rewards = jnp.asarray(rewards)
  if rewards.ndim != 2:
    raise ValueError(
      f"rewards must be [P, G] (prompts × generations per prompt); got shape {rewards.shape}. "
      "Reshape a flat vector with rewards.reshape(num_prompts, num_generations)."
    )
  num_generations = rewards.shape[1]
  if num_generations < 2:
    raise ValueError(
      f"group_advantages needs G >= 2 generations per prompt to compare; got G={num_generations} "
      f"(rewards shape {rewards.shape}). Sample num_generations >= 2 completions per prompt."
    )
  if std not in STD_MODES:
    raise ValueError(f"std={std!r} is not one of {STD_MODES}.")
  eps_value = _checks.concrete_float(eps)
  if eps_value is not None and not eps_value >= 0.0:
    raise ValueError(f"eps={eps_value} must be >= 0 (it is added to the group std).")

  r = fitness.replace_non_finite(rewards.astype(jnp.float32), axis=1)  # [P, G]
  centred = r - jnp.mean(r, axis=1, keepdims=True)  # [P, G]
  sum_sq = jnp.sum(jnp.square(centred), axis=1, keepdims=True)  # [P, 1]
  if std is None:
    group_std = jnp.sqrt(sum_sq / num_generations)  # [P, 1], for the stats only
    advantages = centred
  else:
    ddof = 0 if std == "population" else 1
    group_std = jnp.sqrt(sum_sq / (num_generations - ddof))  # [P, 1]
    advantages = centred / (group_std + eps)
  # Exact comparison, not std == 0: the mean of equal float32 values may round off the value.
  zero_std = jnp.all(r == r[:, :1], axis=1, keepdims=True)  # [P, 1]
  advantages = jnp.where(zero_std, 0.0, advantages)  # [P, G]
  stats = {
    "reward_mean": jnp.mean(r),
    "reward_std": jnp.std(r),
    "group_std_mean": jnp.mean(group_std),
    "advantage_abs_mean": jnp.mean(jnp.abs(advantages)),
    "frac_reward_zero_std": jnp.mean(zero_std.astype(jnp.float32)),
  }
  return advantages, stats


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimator of KL(π_θ ‖ π_ref) (Schulman, "Approximating KL divergence", 2020).

  k3 = exp(ref_logp − logp) − (ref_logp − logp) − 1 ≥ 0, which is 0 iff the two log-probabilities
  are equal; for tokens sampled from π_θ its expectation is exactly KL(π_θ ‖ π_ref), with lower
  variance than −(ref_logp − logp). Used by GRPO (DeepSeekMath, arXiv 2402.03300, Eq. 4).

  Args:
    logp: [...] log π_θ of the sampled tokens.
    ref_logp: [...] log π_ref of the same tokens.

  Returns:
    [...] float32 per-token estimates.
  """
  return _k3_from_log_ratio(ref_logp.astype(jnp.float32) - logp.astype(jnp.float32))


def _k3_from_log_ratio(log_r: jax.Array) -> jax.Array:
  """k3 = exp(log_r) − log_r − 1 for log_r = ref_logp − logp."""
  return jnp.exp(log_r) - log_r - 1.0


def _masked_mean(x: jax.Array, valid: jax.Array, axis: int | None = None) -> jax.Array:
  """Mean of x over valid entries; the count is clamped at 1 so empty rows give 0, not NaN."""
  total = jnp.sum(jnp.where(valid, x, 0.0), axis=axis)
  count = jnp.sum(valid.astype(jnp.float32), axis=axis)
  return total / jnp.maximum(count, 1.0)


def _aggregate(
  per_token: jax.Array, valid: jax.Array, aggregation: str, max_length: int
) -> jax.Array:
  """Reduces a [B, T] per-token loss to a scalar (see `grpo_loss` for the three rules)."""
  if aggregation == "seq_mean_token_mean":
    return jnp.mean(_masked_mean(per_token, valid, axis=1))
  if aggregation == "token_mean":
    return _masked_mean(per_token, valid)
  batch = per_token.shape[0]
  return jnp.sum(jnp.where(valid, per_token, 0.0)) / (batch * max_length)


def grpo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  ref_logp: jax.Array | None,
  advantages: jax.Array,
  mask: jax.Array,
  settings: LossSettings = LossSettings(),
  *,
  entropy: jax.Array | None = None,
  max_length: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GRPO clipped-surrogate loss with a k3 KL penalty (DeepSeekMath, arXiv 2402.03300, Eq. 3-4).

  Per valid token (b, t), with ρ = exp(logp − old_logp), Â_b the sequence's advantage (`settings`):

    ℓ_{b,t} = −min(ρ Â_b, clip(ρ, 1 − eps_low, 1 + eps_high) Â_b) + β k3_{b,t},

  k3 as in `k3_kl`. With n_b = Σ_t mask_{b,t}, the loss L is, by `settings.aggregation`:

  - "seq_mean_token_mean": (1/B) Σ_b (1/n_b) Σ_t ℓ_{b,t}, the paper's Eq. 4 (GRPO).
  - "token_mean": Σ_{b,t} ℓ_{b,t} / Σ_b n_b, every token weighted equally (DAPO, arXiv 2503.14476).
  - "dr_grpo": Σ_{b,t} ℓ_{b,t} / (B · max_length), a constant normaliser (Dr.GRPO, 2503.20783).

  Sums run over valid tokens only. An empty row (n_b = 0) contributes 0 yet still counts in B, so a
  batch split into micro-batches of equal B averages to the full-batch loss. Values at padding may
  be anything, -inf and NaN included: they affect neither the loss nor its gradient.

  `old_logp`, `ref_logp` and `advantages` are constants of the objective: gradients are stopped
  through them here, so the on-policy step may pass `old_logp=logp`.

  Args:
    logp: [B, T] log π_θ of the completion tokens under the policy being trained.
    old_logp: [B, T] log π_old of the same tokens under the policy that sampled them.
    ref_logp: [B, T] log π_ref under the frozen reference, or None when beta is 0.
    advantages: [B] one advantage per sequence (e.g. `group_advantages(...)[0].reshape(-1)`).
    mask: [B, T] 1 (or True) for completion tokens, 0 for padding and prompt tokens.
    settings: the clip widths, the KL weight β and the aggregation (`LossSettings`).
    entropy: optional [B, T] per-token policy entropy, only reported (masked token mean).
    max_length: Dr.GRPO's normaliser (static; default T), e.g. max_new_tokens, so the loss scale
      does not depend on how far a batch was padded.

  Returns:
    (loss, metrics), float32 scalars; the metrics are means over valid tokens: `kl` (k3; 0
    without a reference), `ratio_mean` (ρ), `clip_frac_low` (Â_b < 0 and ρ < 1 − eps_low),
    `clip_frac_high` (Â_b > 0 and ρ > 1 + eps_high), `clip_frac` (their sum: the tokens whose
    surrogate gradient the clip zeroes), `pg_loss` (L with β = 0), `num_tokens`, `entropy` if given.

  Raises:
    ValueError: mismatched shapes, ref_logp None with a beta other than 0.0, or max_length < T.
  """
  logp = jnp.asarray(logp)
  max_length = _check_loss_inputs(logp, old_logp, ref_logp, advantages, mask, entropy, max_length)
  beta_value = _checks.concrete_float(settings.beta)
  if ref_logp is None and beta_value != 0.0:
    beta_is = f"beta={beta_value}" if beta_value is not None else "beta is traced (unknown value)"
    raise ValueError(
      f"ref_logp is None but {beta_is}; pass the reference log-probabilities, or beta=0.0 as a "
      "Python float (not a traced argument) to train without the KL term."
    )
  valid = jnp.asarray(mask) > 0  # [B, T]
  ratio, adv, pg, kl = _surrogate_and_kl(logp, old_logp, ref_logp, advantages, valid, settings)
  per_token = pg if ref_logp is None else pg + settings.beta * kl
  loss = _aggregate(per_token, valid, settings.aggregation, max_length)
  metrics = _loss_metrics(ratio, adv, pg, kl, valid, settings, max_length)
  if entropy is not None:
    metrics["entropy"] = _masked_mean(lax.stop_gradient(entropy).astype(jnp.float32), valid)
  return loss, metrics


def _check_loss_inputs(logp, old_logp, ref_logp, advantages, mask, entropy, max_length) -> int:
  """Raises ValueError for `grpo_loss` inputs of the wrong shapes; returns its max_length."""
  if logp.ndim != 2:
    raise ValueError(f"logp must be [B, T] (sequences × tokens); got shape {logp.shape}.")
  per_token_inputs = {"old_logp": old_logp, "ref_logp": ref_logp, "mask": mask, "entropy": entropy}
  for name, value in per_token_inputs.items():
    if value is not None and jnp.shape(value) != logp.shape:
      raise ValueError(
        f"{name} shape {jnp.shape(value)} does not match logp shape {logp.shape}; every per-token "
        "input must be [B, T] with the same padding."
      )
  batch, length = logp.shape
  if jnp.shape(advantages) != (batch,):
    raise ValueError(
      f"advantages shape {jnp.shape(advantages)} must be [B] = ({batch},) for logp shape "
      f"{logp.shape}: one advantage per sequence, e.g. group_advantages(r)[0].reshape(-1)."
    )
  if max_length is None:
    return length
  if max_length < length:
    raise ValueError(
      f"max_length={max_length} is shorter than the padded length T={length} of logp; pass the "
      "generation budget (max_new_tokens) or leave it None."
    )
  return max_length


def _surrogate_and_kl(logp, old_logp, ref_logp, advantages, valid, settings):
  """(ρ, Â [B, 1], the clipped surrogate −min(ρ Â, clip(ρ) Â), k3) per token, float32 [B, T];
  k3 is 0 without a reference and at padding."""
  logp = logp.astype(jnp.float32)
  old_logp = lax.stop_gradient(old_logp).astype(jnp.float32)
  adv = lax.stop_gradient(advantages).astype(jnp.float32)[:, None]  # [B, 1]
  # where before exp: padding may hold -inf/NaN, which must reach neither the loss nor the grads.
  log_ratio = jnp.where(valid, logp - old_logp, 0.0)  # [B, T]
  ratio = jnp.exp(log_ratio)
  clipped = jnp.clip(ratio, 1.0 - settings.eps_low, 1.0 + settings.eps_high)
  pg = -jnp.minimum(ratio * adv, clipped * adv)  # [B, T]
  kl = jnp.zeros_like(pg)  # [B, T]
  if ref_logp is not None:
    ref_logp = lax.stop_gradient(ref_logp).astype(jnp.float32)
    kl = _k3_from_log_ratio(jnp.where(valid, ref_logp - logp, 0.0))  # 0 at padding
  return ratio, adv, pg, kl


def _loss_metrics(ratio, adv, pg, kl, valid, settings, max_length):
  """`grpo_loss`'s metrics (its docstring), without gradients."""
  ratio_sg, adv_sg = lax.stop_gradient(ratio), adv
  clip_low = (ratio_sg < 1.0 - settings.eps_low) & (adv_sg < 0.0)  # [B, T]
  clip_high = (ratio_sg > 1.0 + settings.eps_high) & (adv_sg > 0.0)  # [B, T]
  return {
    "kl": _masked_mean(lax.stop_gradient(kl), valid),
    "ratio_mean": _masked_mean(ratio_sg, valid),
    "clip_frac_low": _masked_mean(clip_low.astype(jnp.float32), valid),
    "clip_frac_high": _masked_mean(clip_high.astype(jnp.float32), valid),
    "clip_frac": _masked_mean((clip_low | clip_high).astype(jnp.float32), valid),
    "pg_loss": lax.stop_gradient(_aggregate(pg, valid, settings.aggregation, max_length)),
    "num_tokens": jnp.sum(valid.astype(jnp.float32)),
  }


def _logprobs_and_entropy(
  logits: jax.Array, targets: jax.Array, temperature: float
) -> tuple[jax.Array, jax.Array]:
  """[B, T, V] logits, [B, T] targets -> float32 (log p(target), entropy), each [B, T]."""
  x = logits.astype(jnp.float32) / temperature  # [B, T, V]
  logp_v = x - jax.nn.logsumexp(x, axis=-1, keepdims=True)  # [B, T, V]
  logp = jnp.take_along_axis(logp_v, targets[..., None], axis=-1)[..., 0]  # [B, T]
  p = jnp.exp(logp_v)
  # 0·log 0 = 0; the inner where keeps -inf logits (masked vocabulary) out of values and grads.
  entropy = -jnp.sum(p * jnp.where(p > 0.0, logp_v, 0.0), axis=-1)  # [B, T]
  return logp, entropy


def token_logprobs_from_logits(
  logits: jax.Array,
  targets: jax.Array,
  *,
  chunk_size: int | None = None,
  temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Log-probability of each target token and the entropy of each next-token distribution.

  logp_{b,t} = log softmax(logits_{b,t} / τ)[targets_{b,t}],
  H_{b,t} = −Σ_v p_{b,t,v} log p_{b,t,v},   p_{b,t} = softmax(logits_{b,t} / τ),

  computed in float32 whatever the dtype of `logits`. With `chunk_size`, the time axis is processed
  chunk_size positions at a time (`lax.map`, rematerialised in the backward pass), so the float32
  [B, T, V] log-softmax never exists in full: extra memory is O(B · chunk_size · V) in the forward
  and backward passes. Results equal the unchunked path. Measured on XLA:CPU for float32 logits
  [2, 512, 32000] and chunk_size 64: 33 MB of temporaries instead of 262 MB. (XLA:CPU upcasts a
  bfloat16 input to float32 as a whole, so there the forward pass still holds one float32 copy.)

  Args:
    logits: [B, T, V] logits (any float dtype).
    targets: [B, T] int token ids in [0, V).
    chunk_size: positions per chunk (static); None, or >= T, computes everything at once.
    temperature: τ > 0; use the sampler's temperature to get the sampling policy's log-probs.

  Returns:
    (logp [B, T] float32, entropy [B, T] float32).

  Raises:
    ValueError: logits not 3-D, targets not logits.shape[:2], chunk_size < 1, temperature <= 0.
  """
  if jnp.ndim(logits) != 3:
    raise ValueError(f"logits must be [B, T, V]; got shape {jnp.shape(logits)}.")
  if jnp.shape(targets) != jnp.shape(logits)[:2]:
    raise ValueError(
      f"targets shape {jnp.shape(targets)} must equal logits shape {jnp.shape(logits)}[:2]."
    )
  if chunk_size is not None and chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size} must be a positive int, or None for no chunking.")
  temperature_value = _checks.concrete_float(temperature)
  if temperature_value is not None and not temperature_value > 0.0:
    raise ValueError(
      f"temperature={temperature_value} must be > 0; greedy decoding has no log-probabilities, "
      "score its tokens at temperature 1.0."
    )
  batch, length, _ = logits.shape
  if chunk_size is None or chunk_size >= length:
    return _logprobs_and_entropy(logits, targets, temperature)

  num_chunks = length // chunk_size
  head = num_chunks * chunk_size

  @jax.checkpoint  # Keeps only the chunk index per step; the float32 chunk is recomputed.
  def one_chunk(i):
    start = i * chunk_size
    logits_chunk = lax.dynamic_slice_in_dim(logits, start, chunk_size, axis=1)  # [B, C, V]
    targets_chunk = lax.dynamic_slice_in_dim(targets, start, chunk_size, axis=1)  # [B, C]
    return _logprobs_and_entropy(logits_chunk, targets_chunk, temperature)

  logp_kbc, entropy_kbc = lax.map(one_chunk, jnp.arange(num_chunks))  # each [K, B, C]
  logp = jnp.swapaxes(logp_kbc, 0, 1).reshape(batch, head)  # [B, K·C]
  entropy = jnp.swapaxes(entropy_kbc, 0, 1).reshape(batch, head)
  if head < length:
    logp_tail, entropy_tail = _logprobs_and_entropy(
      logits[:, head:], targets[:, head:], temperature
    )
    logp = jnp.concatenate([logp, logp_tail], axis=1)
    entropy = jnp.concatenate([entropy, entropy_tail], axis=1)
  return logp, entropy


def token_logprobs(
  apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array],
  params: Any,
  tokens: jax.Array,
  mask: jax.Array,
  *,
  chunk_size: int | None = None,
  temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probabilities of a token sequence under a causal language model.

  Shift convention: `apply_fn(params, tokens, mask)` returns [B, S, V] logits whose row t is the
  next-token distribution after tokens[:, :t+1]. The outputs are [B, S−1] and index t scores
  tokens[:, t+1]:

    logp[:, t] = log π(tokens[:, t+1] | tokens[:, :t+1]),
    entropy[:, t] = H(π(· | tokens[:, :t+1])).

  So the log-prob of the token at position s of `tokens` is logp[:, s−1], and a completion mask
  over `tokens` becomes the loss mask completion_mask[:, 1:]. Entries whose context position t or
  target position t+1 is padding (mask 0) are set to 0.

  Args:
    apply_fn: (params, tokens [B, S], mask [B, S]) -> logits [B, S, V].
    params: passed through to apply_fn.
    tokens: [B, S] int token ids (prompt + completion).
    mask: [B, S] 1 for real tokens, 0 for padding.
    chunk_size: see `token_logprobs_from_logits` (static).
    temperature: see `token_logprobs_from_logits`.

  Returns:
    (logp [B, S−1] float32, entropy [B, S−1] float32).
  """
  if jnp.ndim(tokens) != 2 or jnp.shape(mask) != jnp.shape(tokens):
    raise ValueError(
      f"tokens must be [B, S] and mask the same shape; got tokens {jnp.shape(tokens)}, "
      f"mask {jnp.shape(mask)}."
    )
  logits = apply_fn(params, tokens, mask)  # [B, S, V]
  if jnp.shape(logits)[:2] != jnp.shape(tokens):
    raise ValueError(
      f"apply_fn returned logits of shape {jnp.shape(logits)}; expected [B, S, V] with "
      f"[B, S] = {jnp.shape(tokens)}."
    )
  # Score all S positions against a shifted target (last one a dummy) rather than slicing the
  # [B, S, V] logits, which could copy them; the dummy column is dropped below.
  targets = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)  # [B, S]
  logp, entropy = token_logprobs_from_logits(
    logits, targets, chunk_size=chunk_size, temperature=temperature
  )
  valid = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)  # [B, S-1]
  return jnp.where(valid, logp[:, :-1], 0.0), jnp.where(valid, entropy[:, :-1], 0.0)
