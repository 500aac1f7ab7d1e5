"""What operators see: Prometheus metrics (more to come: access log, live TUI)."""
