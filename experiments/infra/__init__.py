"""What every run shares: logs, progress, the compile cache, the workdir lock, the completions
log."""
