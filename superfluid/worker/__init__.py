"""The worker process (one per model) and its supervisor in the daemon."""
