"""One line with what to do when a command cannot talk to Kubernetes at all.

Used by every ``hami`` command (:class:`hami.cli.compat.HamiCommand`) and the device
plugin's own error report; classifies by class name so that it imports no client library.
"""

from __future__ import annotations

_WHAT_TO_DO = "check that the cluster is up and that KUBECONFIG / --kubeconfig names it"


def kube_hint(exc: BaseException) -> str | None:
    """One line with what to do for a missing kubeconfig or an unreachable API server;
    None for any other error (it is not ours to hide)."""
    names = {f"{c.__module__}.{c.__name__}" for c in type(exc).__mro__}
    if "lightkube.core.exceptions.ConfigError" in names or (
            type(exc).__name__ == "ConfigError" and "kubeconfig" in str(exc).lower()):
        return (f"no Kubernetes configuration ({exc}): set KUBECONFIG or pass --kubeconfig "
                "FILE, or run inside a pod with a service account")
    if "hami.kube.KubeError" in names and getattr(exc, "code", None) == 0:
        return f"cannot reach the Kubernetes API server ({exc}): {_WHAT_TO_DO}"
    if any(n.startswith(("httpx2.", "httpx.")) and n.endswith(("ConnectError",
                                                                "ConnectTimeout"))
           for n in names) or isinstance(exc, ConnectionRefusedError):
        return f"cannot reach the Kubernetes API server ({exc}): {_WHAT_TO_DO}"
    return None
