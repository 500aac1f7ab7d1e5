"""Runtimes: each executes StepPlans over KV lanes and samples. Only `step` is public."""
