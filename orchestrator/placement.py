"""Where replicas go: placement-group bundles for one replica, and the check
that a layout fits the cluster. Pure: Ray consumes the bundles in deployments/.

Invariant: all tensor-parallel ranks of one replica sit on one node (the
bundles are STRICT_PACK), so a replica needs `gpus <= gpus_per_node`, and a
node hosts whole replicas only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

STRICT_PACK = "STRICT_PACK"


@dataclass(frozen=True)
class ReplicaPlacement:
    """A tensor-parallel replica's STRICT_PACK placement group, and the GPUs
    its replica actor requests itself (inside the first bundle)."""

    bundles: list[dict[str, float]]
    actor_gpus: float


def replica_bundles(num_cpus: float, num_gpus: int, resources: Mapping[str, float]) -> list[dict[str, float]]:
    """One replica's placement group: the replica actor in the first bundle with
    the first GPU rank, one more bundle per further rank. vLLM's Ray executor
    puts its tensor-parallel workers in these bundles."""
    first = {"CPU": num_cpus, "GPU": float(min(num_gpus, 1)), **resources}
    return [first] + [{"GPU": 1.0} for _ in range(num_gpus - 1)]


def per_rank_placement(num_cpus: float, num_gpus: int, resources: Mapping[str, float]) -> ReplicaPlacement:
    """For an engine whose Ray executor places its own rank workers (vLLM):
    one bundle per rank, the actor in the first, holding no GPU itself."""
    return ReplicaPlacement(replica_bundles(num_cpus, num_gpus, resources), actor_gpus=0)


def one_bundle_placement(num_cpus: float, num_gpus: int, resources: Mapping[str, float]) -> ReplicaPlacement:
    """For an engine that spawns its rank processes itself (SGLang): all the
    replica's GPUs in one bundle, held by the actor."""
    return ReplicaPlacement([{"CPU": num_cpus, "GPU": float(num_gpus), **resources}], actor_gpus=num_gpus)


def check_layout(demand: Mapping[str, tuple[int, int]], gpus_per_node: int, nodes: int | None) -> None:
    """Raise ValueError when the pools cannot be placed.

    demand: pool name -> (GPUs per replica, replicas). Replicas are packed
    first-fit by decreasing size onto `nodes` nodes of `gpus_per_node` GPUs
    (None: as many nodes as needed, only the per-node limit is checked)."""
    for name, (gpus, _) in demand.items():
        if gpus > gpus_per_node:
            raise ValueError(
                f"{name}: a replica needs {gpus} GPUs (tensor_parallel_size) but a node has {gpus_per_node}; "
                "a replica's ranks must share one node"
            )
    if nodes is None:
        return
    sizes = sorted((g for g, n in demand.values() for _ in range(n) if g), reverse=True)
    free = [gpus_per_node] * nodes
    for size in sizes:
        slot = next((i for i, f in enumerate(free) if f >= size), None)
        if slot is None:
            wanted = ", ".join(f"{name} {n}x{g}" for name, (g, n) in demand.items() if g)
            raise ValueError(
                f"the pools need {sum(sizes)} GPUs as whole replicas ({wanted}) but the cluster has "
                f"{nodes} node(s) x {gpus_per_node} GPUs; lower replicas/max_replicas or add nodes"
            )
        free[slot] -= size
