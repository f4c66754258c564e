"""What outlives a process: checkpoints, their integrity digests, the SIGTERM save."""
