"""The engine check of an adapter loaded at run time: a one-token request with it on one replica of a pool,
which has that engine load it (vLLM: `add_lora`, refused cleanly) and keep it warm. A refusal is the
adapter's fault (AdapterInvalid, a 400 naming the engine's reason); with no replica up the check is left
to each engine's first request with the adapter, which refuses it the same way."""

from __future__ import annotations

import uuid

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.catalog import AdapterInvalid, EngineCheck
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.pools import PoolClient

# Any vocabulary has token 0; what it means does not matter to a one-token load check.
PROBE_PROMPT = (0,)


def engine_probe(pool: PoolClient) -> EngineCheck:
    async def check(adapter: LoraAdapter) -> None:
        views = pool.replicas()
        if not views:
            return
        request = EngineRequest(
            f"lora-check-{uuid.uuid4().hex}",
            PROBE_PROMPT,
            SamplingSpec(max_tokens=1, temperature=0.0),
            target_replica=views[0].replica_id,
            lora=adapter,
        )
        try:
            async for _ in pool.generate(request, views[0]):
                pass
        except EngineRequestRejected as e:
            raise AdapterInvalid(str(getattr(e, "cause", e))) from None

    return check
