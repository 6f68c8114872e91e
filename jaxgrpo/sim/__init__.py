"""Simulated GRPO runs: the real sampler driven by a synthetic learner.

The project's `MixtureSampler` (snooze tables, balance) and `Rollout`
(dynamic sampling, surplus carry, classification, metrics) run unchanged;
the model is replaced by a `Learner` whose per-example pass rates rise as
it trains on informative groups, so policy comparisons on datasets of a
million examples take seconds per run. Modules: `learner` (the synthetic
learner), `standins` (datasets, tokenizer and generator stand-ins, and the
fast engine's round function), `engine` (`SimSpec`, `run`), `experiments`
(the studies behind `python -m jaxgrpo.sim`) and `plots`.
"""
