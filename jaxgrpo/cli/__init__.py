"""The command lines, one argparse stack.

  train     jaxgrpo-train (also `python -m jaxgrpo.main`): one training run
  evaluate  jaxgrpo-eval: held-out pass@k of checkpoints
  export    jaxgrpo-export: trained params -> a Hugging Face directory
  plot      jaxgrpo-plot: a run's figures and TensorBoard events
  stratify  jaxgrpo-stratify: per-example pass rates and strata tables
  common    what they share: `--config` with `--config.KEY=VALUE`
            overrides, one-line errors and exit codes
"""
