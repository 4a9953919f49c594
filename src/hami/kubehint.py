"""One line with what to do when a command cannot talk to Kubernetes at all.

Used by every ``hami`` command (:class:`hami.cli.compat.HamiCommand`) and the device
plugin's own error report; classifies by class name so that it imports no client library.
"""

from __future__ import annotations

import os
from typing import Any

_WHAT_TO_DO = "check that the cluster is up and that KUBECONFIG / --kubeconfig names it"


def kube_hint(exc: BaseException) -> str | None:
    """One line with what to do for a missing kubeconfig or an unreachable API server;
    None for any other error (it is not ours to hide)."""
    names = {f"{c.__module__}.{c.__name__}" for c in type(exc).__mro__}
    if "lightkube.core.exceptions.ConfigError" in names and str(exc).startswith("kubeconfig "):
        return f"{exc}: fix it, or name another file with KUBECONFIG / --kubeconfig"
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


def load_kubeconfig(path: str | os.PathLike[str] | None) -> Any:
    """lightkube's ``KubeConfig`` from the file ``path``; when None, lightkube's own
    order (in-cluster, then ``$KUBECONFIG``, then ``~/.kube/config``).

    A file that is not UTF-8, not YAML or not a kubeconfig mapping raises lightkube's
    ``ConfigError`` naming the file (lightkube let the YAML parser's multi-line error or
    a ``UnicodeDecodeError`` through, neither naming it); :func:`kube_hint` makes it one
    line. lightkube is imported here, not at the module's import.

    Raises:
        lightkube.core.exceptions.ConfigError: no configuration found, or a broken file.
    """
    import yaml
    from lightkube import KubeConfig
    from lightkube.core.exceptions import ConfigError

    shown = os.fspath(path) if path else os.environ.get("KUBECONFIG", "~/.kube/config")
    try:
        return KubeConfig.from_file(path) if path else KubeConfig.from_env()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"kubeconfig {shown} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"kubeconfig {shown} is not valid YAML{where}") from None
    except (AttributeError, TypeError, KeyError):  # from_dict on a non-mapping
        raise ConfigError(f"kubeconfig {shown} is not a kubeconfig (a mapping of "
                          "clusters, users and contexts)") from None
