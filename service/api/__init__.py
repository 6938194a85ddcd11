"""HTTP routers; the only place that knows about status codes."""
