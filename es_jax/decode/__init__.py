"""Decoding: `sampling.generate`, the jitted decode loop, continuous batching (`queue`) and the
token samplers."""
