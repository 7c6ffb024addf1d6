"""ipam."""
