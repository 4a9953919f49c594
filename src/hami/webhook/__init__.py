"""The mutating admission webhook HTTP surface (``/webhook``; HAMi v2.10)."""
