"""Free loopback ports for the local services (each service binds 127.0.0.1 only)."""
from __future__ import annotations

import socket

__all__ = ["free_ports", "port_open", "HOST"]

HOST = "127.0.0.1"


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` right now (held open together while they
    are picked, so no two are the same)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int, host: str = HOST, timeout: float = 0.2) -> bool:
    """Does something accept connections on ``host:port``?"""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
