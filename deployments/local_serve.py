"""Run one application on a private, local Ray instance, for experiments
(benchmarks/) that drive our app in process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deployments.ingress import ingress_environment, stop_orphaned_haproxy
from orchestrator.config import AppConfig


@contextlib.contextmanager
def serve_locally(config: AppConfig, name: str, port: int) -> Iterator[None]:
    """A fresh Ray instance ("local": never another cluster on this machine)
    serving `config` at http://127.0.0.1:`port`/ until the block ends."""
    import ray
    from ray import serve

    from deployments.app import build_app

    with ingress_environment():
        ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(config), name=name, route_prefix="/", blocking=False)
        yield
    finally:
        serve.shutdown()
        ray.shutdown()
        stop_orphaned_haproxy()


def replica_counts(name: str, deployments: tuple[str, ...]) -> dict[str, int]:
    """Replicas per deployment of application `name` that hold resources now:
    Serve lists starting, running and stopping (draining) ones."""
    from ray import serve

    status = serve.status().applications.get(name)
    counts = {d: 0 for d in deployments}
    if status is not None:
        for d, overview in status.deployments.items():
            if d in counts:
                counts[d] = sum(overview.replica_states.values())
    return counts
