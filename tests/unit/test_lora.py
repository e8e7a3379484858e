"""LoRA adapters through the public surfaces: the catalog's lifecycle across two frontends sharing a store,
vLLM's adapter calls on the OpenAI app (admin-only), a request naming an adapter reaching both pools with
it, and the KV index keeping each adapter's blocks to its own prompts (vLLM's own event classes)."""

from __future__ import annotations

import json
import re

import httpx
import msgspec
import pytest
import vllm.distributed.kv_events as kv_events

from orchestrator.api.app import AppHooks, build_openai_app
from orchestrator.config import PRIMARY_GROUP, AppConfig
from orchestrator.engines.base import EngineError, EngineRequestRejected
from orchestrator.engines.vllm_kv_events import decode_batch, encode_batch
from orchestrator.frontend import PoolGroup, build_frontend
from orchestrator.kv.events import BlockStored, KVEventBatch
from orchestrator.kv.index import KVIndex
from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.catalog import AdapterCatalog, AdapterConflict, AdapterInvalid, AdapterNotFound
from orchestrator.lora.probe import PROBE_PROMPT, engine_probe
from orchestrator.lora.store import MemoryAdapterStore
from orchestrator.lora.tiny import make_tiny_lora
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.sim.block_manager import BlockManager
from tests.factories import FakePool, WordTokenizer, run

MODEL_CONFIG = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}


@pytest.fixture
def adapters(tmp_path):
    """Two tiny adapters and one of rank 32, in PEFT's format, and a directory that is none."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    made = {name: str(make_tiny_lora(model, tmp_path / name, seed=i)) for i, name in enumerate(["a", "b"])}
    made["rank32"] = str(make_tiny_lora(model, tmp_path / "rank32", seed=9, rank=32))
    (tmp_path / "empty").mkdir()
    made["empty"] = str(tmp_path / "empty")
    return made


class CountingStore(MemoryAdapterStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def all(self):
        self.reads += 1
        return await super().all()


def test_two_frontends_sharing_a_store_serve_one_adapter_set(adapters):
    store = CountingStore()
    configured = [LoraAdapter("fixed", adapters["a"])]
    one = AdapterCatalog("base", configured, store, max_lora_rank=16)
    two = AdapterCatalog("base", configured, store, max_lora_rank=16)

    async def lifecycle():
        assert one.resolve("base") is None and one.resolve("fixed") == configured[0]
        await one.load(LoraAdapter("b", adapters["b"]))
        # The other frontend never read the store: a request naming the adapter reads it once.
        assert await two.lookup("b") == LoraAdapter("b", adapters["b"])
        reads = store.reads
        for _ in range(3):  # each miss reads the store once, even right after a read
            with pytest.raises(AdapterNotFound):
                await two.lookup("nope")
        assert store.reads == reads + 3

        await two.unload("b")
        assert [a.name for a in one.adapters()] == ["fixed", "b"]  # until its refresh
        await one.refresh()
        assert [a.name for a in one.adapters()] == ["fixed"]
        with pytest.raises(AdapterNotFound):
            one.resolve("b")

    run(lifecycle())


def test_what_cannot_be_loaded_or_unloaded_is_refused_and_nothing_changes(adapters):
    store = MemoryAdapterStore()
    checked = []

    async def engine_check(adapter):
        checked.append(adapter.name)
        if adapter.name == "engine-refuses":
            raise AdapterInvalid("LoRA adapter 'engine-refuses' cannot be loaded: unsupported target modules")

    catalog = AdapterCatalog("base", [LoraAdapter("fixed", adapters["a"])], store, 16, engine_check)

    async def attempts():
        refusals = {}
        for adapter in [
            LoraAdapter("base", adapters["a"]),
            LoraAdapter("fixed", adapters["b"]),
            LoraAdapter("big", adapters["rank32"]),
            LoraAdapter("empty", adapters["empty"]),
            LoraAdapter("gone", "/nonexistent/adapter"),
            LoraAdapter("engine-refuses", adapters["b"]),
        ]:
            with pytest.raises((AdapterConflict, AdapterInvalid)) as refused:
                await catalog.load(adapter)
            refusals[adapter.name] = str(refused.value)
        with pytest.raises(AdapterConflict, match="model.lora.adapters"):
            await catalog.unload("fixed")
        with pytest.raises(AdapterNotFound):
            await catalog.unload("never-loaded")
        await catalog.load(LoraAdapter("b", adapters["b"]))
        with pytest.raises(AdapterConflict, match="already been loaded"):
            await catalog.load(LoraAdapter("b", adapters["a"]))
        return refusals, await store.all()

    refusals, stored = run(attempts())
    assert refusals["base"] == "The lora adapter 'base' conflicts with a served base model."
    assert "already been loaded" in refusals["fixed"]
    assert "rank 32, above model.lora.max_lora_rank (16)" in refusals["big"]
    assert "has no adapter_config.json" in refusals["empty"]
    assert "is not a directory" in refusals["gone"]
    assert "unsupported target modules" in refusals["engine-refuses"]
    assert checked == ["engine-refuses", "b"]  # the engine sees only what passed the local checks
    assert stored == (LoraAdapter("b", adapters["b"]),)


def test_an_adapter_reloaded_from_another_source_is_new_to_the_engines():
    """vLLM keys loaded weights by lora_int_id: the same id for new weights would serve the old ones."""
    first, again, other = LoraAdapter("x", "/a/x"), LoraAdapter("x", "/a/x"), LoraAdapter("x", "/b/x")
    assert first.engine_id == again.engine_id != other.engine_id
    assert 0 < first.engine_id < 2**31


def test_the_engine_probe_turns_a_replicas_refusal_into_an_invalid_adapter():
    class RefusingPool(FakePool):
        def generate(self, request, view=None):
            self.generates.append(request)
            raise EngineRequestRejected("LoRA adapter 'x' cannot be loaded: LoRA rank 64 is greater than 16.")

    pool, empty = RefusingPool("decode_pool", ("r0", "r1")), FakePool("decode_pool", ())
    with pytest.raises(AdapterInvalid, match="rank 64"):
        run(engine_probe(pool)(LoraAdapter("x", "/a/x")))
    (probe,) = pool.generates
    assert probe.lora == LoraAdapter("x", "/a/x") and probe.target_replica == "r0"
    assert probe.sampling.max_tokens == 1
    run(engine_probe(empty)(LoraAdapter("x", "/a/x")))  # no replica up: each engine checks on first use


def _app(config: AppConfig, groups, admin_key=None, api_key=None, check=None):
    parts = build_frontend(config, groups, WordTokenizer(), adapter_check=check)

    async def health():
        return parts.health()

    hooks = AppHooks(health=health, pools=parts.pools_report, api_key=api_key, admin_key=admin_key)
    return build_openai_app(parts.service, hooks)


def _lora_config(adapters, **extra) -> AppConfig:
    sim = {"engine": {"kind": "sim"}}
    return AppConfig.model_validate(
        {
            "model": {
                "name": "m",
                "source": "org/m",
                "max_model_len": 4096,
                "lora": {"max_loras": 2, "adapters": [{"name": "fixed", "source": adapters["a"]}]},
            },
            "prefill_pool": sim,
            "decode_pool": sim,
            "routing": {"kv_events": False, "local_prefill_max_tokens": 0},
            **extra,
        }
    )


def test_adapters_through_the_openai_app_on_both_pools(adapters):
    """vLLM's calls and answers: /v1/models lists adapters with their parent; a request naming one runs with
    it on the prefill and the decode replica; unknown names are a 404 in OpenAI's shape."""
    decode, prefill = FakePool("decode_pool"), FakePool("prefill_pool", ("p0",))
    app = _app(_lora_config(adapters), {PRIMARY_GROUP: PoolGroup(decode, prefill)})

    async def session():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
            out = {"models": (await c.get("/v1/models")).json()}
            body = {"lora_name": "b", "lora_path": adapters["b"]}
            out["load"] = await c.post("/v1/load_lora_adapter", json=body)
            out["load_again"] = await c.post("/v1/load_lora_adapter", json=body)
            out["relative"] = await c.post("/v1/load_lora_adapter", json={"lora_name": "r", "lora_path": "./r"})
            out["models_after"] = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
            prompt = " ".join(f"w{i}" for i in range(40))
            out["with_b"] = await c.post("/v1/completions", json={"model": "b", "prompt": prompt, "max_tokens": 2})
            out["base"] = await c.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2})
            out["unknown"] = await c.post("/v1/completions", json={"model": "zz", "prompt": "a", "max_tokens": 2})
            out["unload"] = await c.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
            out["unload_again"] = await c.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
            out["after_unload"] = await c.post("/v1/completions", json={"model": "b", "prompt": "a", "max_tokens": 2})
            return out

    out = run(session())
    base, fixed = out["models"]["data"]
    assert base["id"] == "m" and "parent" not in base
    assert (fixed["id"], fixed["parent"], fixed["root"], fixed["object"]) == ("fixed", "m", adapters["a"], "model")
    assert out["load"].status_code == 200 and out["load"].text == "Success: LoRA adapter 'b' added successfully."
    assert (
        out["load_again"].status_code == 400 and "already been loaded" in out["load_again"].json()["error"]["message"]
    )
    assert out["relative"].status_code == 400 and out["relative"].json()["error"]["param"] == "lora_path"
    assert out["models_after"] == ["m", "fixed", "b"]
    assert out["with_b"].status_code == 200 and out["with_b"].json()["model"] == "b"
    assert out["base"].status_code == 200 and out["base"].json()["model"] == "m"
    b = LoraAdapter("b", adapters["b"])
    assert [r.lora for r in prefill.prefills] == [b, None]
    probe, *served = decode.generates  # the load's engine check came first, on a decode replica
    assert probe.lora == b and probe.prompt_token_ids == PROBE_PROMPT and probe.sampling.max_tokens == 1
    assert [r.lora for r in served] == [b, None]
    for refused in ("unknown", "after_unload"):
        assert out[refused].status_code == 404 and out[refused].json()["error"]["code"] == "model_not_found"
    assert out["unload"].status_code == 200
    assert out["unload_again"].status_code == 404
    assert out["unload_again"].json()["error"]["message"] == "The lora adapter 'b' cannot be found."


def test_a_load_whose_engine_check_fails_is_a_503_and_loads_nothing(adapters):
    """The engine failed (not the adapter's fault): the API's error shape, and the adapter is not served."""

    async def dead_engine(adapter):
        raise EngineError("engine unhealthy: EngineDeadError")

    groups = {PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"), FakePool("prefill_pool", ("p0",)))}
    app = _app(_lora_config(adapters), groups, check=dead_engine)

    async def calls():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
            load = await c.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": adapters["b"]})
            use = await c.post("/v1/completions", json={"model": "b", "prompt": "a", "max_tokens": 1})
            return load, use

    load, use = run(calls())
    assert load.status_code == 503 and "nothing was loaded" in load.json()["error"]["message"]
    assert use.status_code == 404


def test_the_adapter_calls_are_admin_only(adapters):
    groups = {PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"), FakePool("prefill_pool", ("p0",)))}
    keyed = _app(_lora_config(adapters), groups, admin_key="admin", api_key="user")
    no_admin = _app(_lora_config(adapters), groups, api_key="user")
    body = {"lora_name": "b", "lora_path": adapters["b"]}

    async def calls():
        statuses = []
        for app, key in [(keyed, "user"), (keyed, None), (no_admin, "user"), (keyed, "admin")]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                statuses.append((await c.post("/v1/load_lora_adapter", json=body, headers=headers)).status_code)
        return statuses

    assert run(calls()) == [401, 401, 403, 200]


def test_an_app_without_lora_names_the_setting_and_refuses_adapter_calls():
    config = AppConfig.model_validate(
        {"model": {"name": "m", "source": "org/m", "max_model_len": 4096}, "decode_pool": {"engine": {"kind": "sim"}}}
    )
    app = _app(config, {PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"))})

    async def call():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as c:
            return await c.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/x"})

    response = run(call())
    assert response.status_code == 400 and "set model.lora" in response.json()["error"]["message"]


def _vllm_stored(hashes, parent, tokens, lora_name=None):
    """A BlockStored as vLLM's engine publishes it: the adapter's name on the event and in every block's keys."""
    from vllm.v1.core.kv_cache_utils import to_event_extra_keys

    keys = [(("lora", lora_name, "/path"),) for _ in hashes] if lora_name else None
    return kv_events.BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=32,
        lora_id=7 if lora_name else None,
        medium=kv_events.MEDIUM_GPU,
        lora_name=lora_name,
        extra_keys=to_event_extra_keys(keys),
    )


def test_an_adapters_blocks_are_hits_for_its_own_prompts_alone():
    payload = msgspec.msgpack.Encoder().encode(
        kv_events.KVEventBatch(
            ts=0.0,
            events=[_vllm_stored([11, 12], None, range(64), "a"), _vllm_stored([13], 12, range(64, 96), "a")],
        )
    )
    index = KVIndex()
    index.apply("d0", decode_batch(bytes(8), payload).events)

    def held(lora):
        request = EngineRequest("r", tuple(range(96)), SamplingSpec(max_tokens=1), lora=lora)
        return PromptBlocks.of(request, 32, index).overlaps

    assert held(LoraAdapter("a", "/path")) == {"d0": 3}
    assert held(None) == {} and held(LoraAdapter("b", "/path")) == {}


def test_the_simulated_engine_publishes_an_adapters_blocks_as_vllm_does():
    """Its events, in vLLM's wire format, index under the adapter, and its own prefix cache keeps adapters apart."""
    blocks = BlockManager(num_blocks=16, block_size=32)
    seq = blocks.allocate(list(range(65)), lora_name="a")
    blocks.mark_computed(seq, 65)
    assert blocks.cached_prefix(list(range(65)), lora_name="a") != []
    assert blocks.cached_prefix(list(range(65))) == [] and blocks.cached_prefix(list(range(65)), None, "b") == []
    events = tuple(blocks.drain_events())
    assert {e.lora_name for e in events if isinstance(e, BlockStored)} == {"a"}
    index = KVIndex()
    index.apply("d0", decode_batch(*encode_batch(KVEventBatch(0, 0.0, events))).events)
    request = EngineRequest("r", tuple(range(65)), SamplingSpec(max_tokens=1), lora=LoraAdapter("a", "/p"))
    assert PromptBlocks.of(request, 32, index).overlaps == {"d0": 2}


@pytest.mark.parametrize(
    ("lora", "model_name", "problem"),
    [
        ({"max_loras": 4, "max_cpu_loras": 2}, "m", "max_cpu_loras (2) must be at least max_loras (4)"),
        ({"adapters": [{"name": "x", "source": "/a"}, {"name": "x", "source": "/b"}]}, "m", "repeated: ['x']"),
        ({"adapters": [{"name": "m", "source": "/a"}]}, "m", "cannot take the base model's name 'm'"),
        ({"max_lora_rank": 0}, "m", "greater than 0"),
    ],
)
def test_the_lora_config_names_what_is_wrong(lora, model_name, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        AppConfig.model_validate(
            {
                "model": {"name": model_name, "source": "org/m", "max_model_len": 64, "lora": lora},
                "decode_pool": {"engine": {"kind": "sim"}},
            }
        )
