"""What Serve says of a running application: its replicas, for experiments (benchmarks/) that drive our app
in process, and the address its HTTP ingress binds, for the frontend's secure default."""

from __future__ import annotations


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


async def serve_http_host() -> str:
    """The address Serve's HTTP ingress binds (`http_options.host`), asked of Serve's controller."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    return (await controller.get_http_config.remote()).host
