"""Starting or joining Ray.

Local mode starts its own Ray instance (even where another run's Ray is up on the same machine), binds every Ray
listener to loopback (127.0.0.1), starts no dashboard unless asked and sends no usage statistics; ``ray_address``
joins an existing cluster instead.
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
    return ray.cluster_resources()
