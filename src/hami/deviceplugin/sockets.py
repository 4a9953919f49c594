"""Unix socket paths of the node agents, checked before anything is bound or created.

A unix socket's path lives in ``sockaddr_un.sun_path``: 108 bytes with the terminating
NUL, so at most 107 (unix(7)). gRPC's unix listener refuses paths of 106 and 107 bytes
too ("Failed to bind", measured with grpcio 1.85.4), while its client connects up to
107. A path over the limit fails deep in gRPC (bind) or never connects (the client
retries forever); these checks turn it into one error naming the path and the limit.
Used by ``hami device-plugin`` (its kubelet socket and, in CDI mode, the kubelet's
pod-resources socket) and ``hami dra-plugin`` (its registration and DRA sockets).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

#: The most bytes of a socket path gRPC listens on.
MAX_SOCKET_PATH_BYTES = 105
#: The most bytes of a socket path a client connects to (``sun_path`` less its NUL).
MAX_CONNECT_PATH_BYTES = 107


class SocketPathError(RuntimeError):
    """A unix socket path is longer than a socket can have."""


def check_socket_paths(listen: Iterable[Path] = (), connect: Iterable[Path] = ()) -> None:
    """Check the paths of sockets to listen on (at most :data:`MAX_SOCKET_PATH_BYTES`
    bytes, as the file system encodes them) and to connect to (at most
    :data:`MAX_CONNECT_PATH_BYTES`). Touches nothing on disk.

    Raises:
        SocketPathError: the first path over its limit, named with its size and the
            limit.
    """
    for paths, limit, fix in ((listen, MAX_SOCKET_PATH_BYTES, "choose a shorter directory"),
                              (connect, MAX_CONNECT_PATH_BYTES,
                               "give a shorter path (a symlink to its directory will do)")):
        for p in paths:
            size = len(os.fsencode(p))
            if size > limit:
                raise SocketPathError(f"socket path {p} is {size} bytes; a unix socket's "
                                      f"path has at most {limit}: {fix}")
