"""GRPO: the loss (`loss`), rollouts, the training state and the update step."""
