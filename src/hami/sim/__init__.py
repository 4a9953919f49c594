"""Trace replay and capacity planning on top of :mod:`hami.core` (no I/O beyond reading traces)."""
