"""TODO models."""
