"""Experiment configs: each file's `get_config(arg)` returns a ConfigDict.

`--config=configs/NAME.py[:ARG]` names one (from a clone, `configs/` links
here; from anywhere else, the command line finds the shipped file), and
`common.base_config()` holds every key with its default.
"""
