"""TODO pipeline."""
