"""TODO assess."""
