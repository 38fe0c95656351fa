"""Loopback ports for the tests' servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listened on a moment ago (bound, then released): for a
    process that must be told its port, or a target nothing answers on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


__all__ = ["free_port"]
