"""Offline difficulty stratification: per-example pass rates of models.

`jaxgrpo-stratify run` samples K completions of each training example under
one or more checkpoints and stores pass rates by example id
(`passrates`); `jaxgrpo-stratify report` splits them into strata
(`bands`). Importing this package, `passrates` or `bands` loads no JAX.
"""
