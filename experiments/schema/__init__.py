"""The config's rules (`check`), cross-field rules, errors and `--help_config`; the defaults live in
experiments/configs/."""
