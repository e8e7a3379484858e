"""What our vLLM adapter hands vLLM: the engine arguments a pool's settings become."""

from __future__ import annotations

import pytest

from orchestrator.config import AppConfig
from orchestrator.engines import EngineSpec
from orchestrator.engines.base import EngineRole
from orchestrator.engines.vllm_engine import VllmEngine


def _engine(role: EngineRole, **network) -> VllmEngine:
    engine = {"kind": "vllm", "device": "cpu"}
    app = AppConfig.model_validate(
        {
            "model": {"name": "m", "source": "org/m", "max_model_len": 4096},
            "prefill_pool": {"engine": engine},
            "decode_pool": {"engine": engine},
            "kv_cache": {"block_size": 32},
            "network": network,
        }
    )
    pool = app.prefill_pool if role is EngineRole.PREFILL else app.decode_pool
    return VllmEngine(EngineSpec.for_pool(app, pool, role, "127.0.0.1"))


@pytest.mark.parametrize("role", [EngineRole.PREFILL, EngineRole.DECODE])
def test_the_kv_lease_is_set_explicitly_on_both_sides_of_a_transfer(role):
    default = _engine(role)._engine_args(None).kv_transfer_config
    short = _engine(role, kv_lease_s=10)._engine_args(None).kv_transfer_config
    assert default.kv_connector == "NixlConnector"
    assert default.get_from_extra_config("kv_lease_duration", None) == 30
    assert short.get_from_extra_config("kv_lease_duration", None) == 10
    assert short.kv_load_failure_policy == "recompute"


def test_a_lease_shorter_than_vllms_renewal_step_is_refused():
    with pytest.raises(ValueError, match="kv_lease_s"):
        _engine(EngineRole.DECODE, kv_lease_s=5)
