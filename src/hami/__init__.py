"""hami: GPU sharing for Kubernetes, wire-compatible with HAMi v2.10 / HAMi-core 1.2."""

__version__ = "0.1.0"
