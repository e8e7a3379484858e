"""Ray Serve's own default autoscaling policy, driven in the cluster
simulator's virtual time: Ray's code decides, only its inputs are ours.

    every `tick_s` (Serve's controller runs its loop every 0.1 s; a second
    changes nothing the delays can see):
      ongoing  = requests routed to the pool's serving replicas and not yet
                 done with them (what Serve counts: queued + running there)
      average  = the mean of those samples over `look_back_period_s`
                 (`aggregation_function` mean, Serve's default)
      decision = ray.serve.autoscaling_policy.replica_queue_length_autoscaling_policy,
                 wrapped by `_apply_autoscaling_config` (scaling factors,
                 up/down-scale delays) exactly as the controller wraps it,
                 then clamped to [min_replicas, max_replicas] (apply_bounds)

Its delay logic reads `time.time()`; that one name in Ray's module is pointed
at the simulator's clock while the policy runs (`_virtual_time`), nothing else
of Ray's is changed.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections import deque
from collections.abc import Callable, Iterator

from ray.serve import autoscaling_policy as ray_policy
from ray.serve._private.common import DeploymentID
from ray.serve.config import AutoscalingConfig, AutoscalingContext


@contextlib.contextmanager
def _virtual_time(now: float) -> Iterator[None]:
    real = ray_policy.time
    ray_policy.time = types.SimpleNamespace(time=lambda: now, monotonic=lambda: now)
    try:
        yield
    finally:
        ray_policy.time = real


class RayDefaultPolicy:
    """One pool's autoscaler: `sample` its ongoing requests often, `decide` once a tick."""

    def __init__(self, config: AutoscalingConfig, deployment: str, app: str = "sim") -> None:
        self.config = config
        self._id = DeploymentID(name=deployment, app_name=app)
        self._policy = ray_policy._apply_autoscaling_config(ray_policy.replica_queue_length_autoscaling_policy)
        self._state: dict = {}
        self._samples: deque[tuple[float, float]] = deque()

    def sample(self, now: float, ongoing: float) -> None:
        self._samples.append((now, ongoing))
        while self._samples and self._samples[0][0] < now - self.config.look_back_period_s:
            self._samples.popleft()

    def decide(self, now: float, running: int, target: int) -> int:
        """The pool's new target replica count; `running`: serving now, `target`: the current target
        (starting ones included)."""
        average = sum(v for _, v in self._samples) / len(self._samples) if self._samples else 0.0
        ctx = AutoscalingContext(
            deployment_id=self._id,
            deployment_name=self._id.name,
            app_name=self._id.app_name,
            current_num_replicas=running,
            target_num_replicas=target,
            running_replicas=[],
            total_num_requests=average,
            total_queued_requests=0.0,
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=self.config.min_replicas,
            capacity_adjusted_max_replicas=self.config.max_replicas,
            policy_state=dict(self._state),
            last_scale_up_time=None,
            last_scale_down_time=None,
            current_time=now,
            config=self.config,
        )
        with _virtual_time(now):
            decision, self._state = self._policy(ctx)
        decision = math.ceil(decision) if isinstance(decision, float) else decision
        return max(self.config.min_replicas, min(self.config.max_replicas, decision))


def ray_default_controller(
    targets: dict[str, float],
    startup_s: float,
    max_replicas: int,
    log: list[dict],
    tick_s: float = 1.0,
    until_s: float = math.inf,
) -> Callable:
    """A cluster-simulator controller (ClusterSim.every) running Ray's policy per pool."""
    policies = {
        name: RayDefaultPolicy(
            AutoscalingConfig(min_replicas=1, max_replicas=max_replicas, target_ongoing_requests=target), f"{name}_pool"
        )
        for name, target in targets.items()
    }

    def make(sim):
        from orchestrator.sim.cluster import ReplicaState

        def control(sim) -> None:
            for name, policy in policies.items():
                ready = [r for r in sim.pool(name) if r.state is ReplicaState.READY]
                policy.sample(sim.now, sum(r.inflight for r in ready))
                target = sim.count(name, ReplicaState.STARTING, ReplicaState.READY)
                wanted = policy.decide(sim.now, len(ready), target)
                if wanted != target:
                    sim.resize(name, wanted, startup_s)
            if not log or sim.now - log[-1]["t"] >= 10.0 - 1e-9:
                log.append({"t": sim.now, "prefill": sim.count("prefill"), "decode": sim.count("decode")})

        return control

    return make
