"""What a run shows and records, computed from its metrics.

  console      progress bars, log lines, quiet mode
  metrics      metrics.jsonl, the run's record, and its console lines
  summary      the end-of-run table
  tensorboard  the same scalars as TensorBoard events (tensorboardX)
  plot         figures of a run (matplotlib); plot_panels, what each shows
"""
