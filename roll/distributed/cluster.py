"""Starting or joining Ray.

Local mode starts its own Ray instance (even where another run's Ray is up on the same machine), binds every Ray
listener to loopback (127.0.0.1), keeps Ray's token authentication on (Ray's default; its notice saying so on every
start is dropped), starts no dashboard unless asked and sends no usage statistics; ``ray_address`` joins an existing
cluster instead.
"""

from __future__ import annotations

import logging
import os
from typing import Any

LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "1",
    "RAY_worker_niceness": "0",  # Ray starts workers at nice 15: on a shared machine every other process came first
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
}


def start_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    include_dashboard: bool = False,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Initialise Ray once per process; returns the cluster's resources.

    Workers inherit ``env_vars`` (the config's ``system_envs``) through Ray's runtime env.
    """
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    keep = _keep_sigterm_handler()
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    # workers import user modules (custom envs, rewards) from the launch directory, like the driver
    path = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    runtime_env = {"env_vars": {**{k: os.environ[k] for k in LOOPBACK_ENV}, "PYTHONPATH": path, **(env_vars or {})}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
    else:
        # "local": a new instance even where another run's Ray is up on this machine (without an address, Ray
        # joins the newest one it finds, and then refuses num_cpus)
        _quiet_token_notice()
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=include_dashboard,
            _node_ip_address="127.0.0.1",
            runtime_env=runtime_env,
            logging_level=logging.WARNING,
            configure_logging=True,
            log_to_driver=True,
        )
    keep()
    return ray.cluster_resources()


#: Ray's notice, on every start of a local cluster, that token authentication is on (docs/debugging.md says it once).
TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"


class _QuietTokenNotice(logging.Filter):
    """Drops Ray's per-run notice that token authentication is on (it stays on: only the line goes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return TOKEN_NOTICE not in record.getMessage()


def _quiet_token_notice() -> None:
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _QuietTokenNotice) for f in logger.filters):
        logger.addFilter(_QuietTokenNotice())


def _keep_sigterm_handler() -> Any:
    """``ray.init`` replaces the process's SIGTERM handler with ``sys.exit``; the returned function puts back a
    handler of the launcher's own (which stops a run with its resume line, naming SIGTERM), if there is one."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):  # the default: leave Ray's
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
