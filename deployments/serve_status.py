"""What Serve says of a running application, for experiments (benchmarks/)
that drive our app in process and must read Serve's own view of it."""

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
