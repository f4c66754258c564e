"""Reports across finished runs: their files, curves, tables and plots."""
