"""The scheduler-extender HTTP surface (``/filter``, ``/bind``; spec §4.1)."""
