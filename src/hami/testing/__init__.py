"""Test support: a real local Kubernetes control plane and helpers for e2e tests.

Nothing in the product imports this package; it needs ``lightkube`` and ``cryptography``.
"""
