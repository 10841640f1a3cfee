"""Network helpers: free ports for rendezvous, this node's address (the worker groups and the weight group use them)."""

from __future__ import annotations

import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (for a torch.distributed rendezvous; default: loopback)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """This node's IP as Ray knows it (other nodes reach it there); loopback outside Ray."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    return "127.0.0.1"
