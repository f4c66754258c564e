#!/usr/bin/env bash
# The accelerator runs of the sampler and ES-core throughput goals, as one prepared script
# for a machine lent for a few minutes:
#
#   OUT=/path/to/logs bash experiments/benchmarks/device_checks.sh
#   DRY_RUN=1 OUT=/tmp/dry bash experiments/benchmarks/device_checks.sh   # tiny sizes, any CPU
#
# Runs from the repository root with the machine's own Python ($PYTHON, default python3), which
# must already have jax (with its accelerator plugin), flax, optax, orbax-checkpoint, chex,
# transformers and torch: es_jax is used from this source tree (PYTHONPATH); nothing is installed
# and no network is needed (importing es_jax does not need tensorflow_datasets). The models are
# SmolLM2-135M's architecture with random weights (`smollm2-random` / preset `smollm2-135m`: the
# bundled 98 MB GGUF may not travel) and small random ones; every benchmark decodes a fixed number
# of tokens, so the timed work does not depend on the weights. Each check is cut at
# $CHECK_TIMEOUT seconds (default 150) and writes $OUT/<name>.log; the console gets its last lines.
set -u
OUT=${OUT:-device_logs}
PY=${PYTHON:-python3}
LIMIT=${CHECK_TIMEOUT:-150}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

check() {
  local name=$1
  shift
  echo "=== $name: $*"
  timeout "$LIMIT" "$PY" -m "$@" >"$OUT/$name.log" 2>&1
  echo "--- exit $? ($OUT/$name.log)"
  grep -v -e '^[IWE][0-9]' -e 'Loading weights' "$OUT/$name.log" | tail -n 22
}

"$PY" - <<'EOF' 2>&1 | tee "$OUT/versions.log"
import flax, jax, optax, orbax.checkpoint, torch, transformers
print("jax", jax.__version__, jax.devices(), "| flax", flax.__version__, "| optax",
      optax.__version__, "| transformers", transformers.__version__, "| torch", torch.__version__,
      "cuda" if torch.cuda.is_available() else "cpu")
EOF
TORCH_DEVICE=$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')

if [ "${DRY_RUN:-0}" = 1 ]; then
  SAMPLER=(--models tiny --batch_sizes 2 --new_tokens 8 --repeats 1)
  THROUGHPUT=(--model tiny-llama --population 4 --members_per_chunk 2 --repeats 1)
  SEQUENTIAL=(--model tiny --population 4 --repeats 1)
else
  # Sampler: batch 1 and 16, 64 greedy tokens, transformers on the same accelerator.
  SAMPLER=(--models smollm2-random,tiny --batch_sizes 1,16)
  # ES throughput: N=16 members x 4 prompts x 16 tokens, 8 members per chunk.
  THROUGHPUT=(--model smollm2-135m --population 16 --members_per_chunk 8 --repeats 3)
  SEQUENTIAL=(--model smollm2-random --population 16 --members_per_chunk 8 --repeats 2)
fi
check sampler experiments.benchmarks.sampler_vs_transformers "${SAMPLER[@]}" \
  --torch_device "$TORCH_DEVICE"
check es_throughput experiments.benchmarks.es_throughput "${THROUGHPUT[@]}" --skip_prng
check es_vs_sequential experiments.benchmarks.es_vs_sequential "${SEQUENTIAL[@]}"
