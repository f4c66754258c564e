#!/usr/bin/env bash
# Starts the same experiment on every worker (jax.distributed joins them), detached, logging to
# ~/run.log on each worker. Workdirs should be gs:// so that all hosts share checkpoints.
# Usage: ./launch.sh experiments/configs/gsm8k_easy.py gs://BUCKET/runs/es --config.method=es
# Rerunning the same command after a preemption resumes from the newest checkpoint.
source "$(dirname "$0")/common.sh"
config="$1"; workdir="$2"; shift 2
args="$*"
tpu_ssh "cd $REMOTE_DIR && nohup .venv/bin/python -m experiments.main --config $config \
  --workdir $workdir --config.progress=False $args > ~/run.log 2>&1 &"
echo "launched on $TPU_NAME; follow with ./logs.sh"
