"""jaxgrpo: GRPO for language models with verifiable rewards, in JAX."""

__version__ = "0.1.0"
