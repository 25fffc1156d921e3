"""TODO trainer3d."""
