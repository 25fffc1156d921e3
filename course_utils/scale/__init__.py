"""TODO scale."""
