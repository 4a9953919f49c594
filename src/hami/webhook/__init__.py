"""The mutating admission webhook HTTP surface (``/webhook``; spec §3)."""
