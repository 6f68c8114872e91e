"""Llama-family decoder: config, layers, attention and the model."""
