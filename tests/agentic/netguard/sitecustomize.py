"""Imported at start-up by every Python process whose ``PYTHONPATH`` holds this folder (the end-to-end tests of the
agent frameworks put it there): a connection to anything but this machine fails, and is written to the file named by
``ROLL_NETGUARD_LOG``, so a harness, its framework or roll that reaches for the network fails the test even where the
caller swallows the error (e.g. a price-list download that falls back to a bundled copy)."""

from __future__ import annotations

import os
import socket

_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex


def _local(address: object) -> bool:
    if isinstance(address, (str, bytes)):  # a Unix socket
        return True
    host = str(address[0]) if isinstance(address, tuple) and address else ""
    return host.startswith("127.") or host in ("localhost", "::1", "0.0.0.0", "")


def _refuse(address: object) -> None:
    log = os.environ.get("ROLL_NETGUARD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {address!r}\n")
    raise ConnectionRefusedError(f"netguard: a connection to {address!r} left the machine (tests run offline)")


def connect(self: socket.socket, address: object) -> None:
    if not _local(address):
        _refuse(address)
    return _connect(self, address)


def connect_ex(self: socket.socket, address: object) -> int:
    if not _local(address):
        _refuse(address)
    return _connect_ex(self, address)


socket.socket.connect = connect  # type: ignore[method-assign]
socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
