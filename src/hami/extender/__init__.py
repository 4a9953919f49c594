"""The scheduler-extender HTTP surface (``/filter``, ``/bind``; HAMi v2.10)."""
