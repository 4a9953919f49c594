"""Wire shapes and names shared by every component (no logic, no I/O)."""
