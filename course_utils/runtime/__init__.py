"""TODO runtime."""
