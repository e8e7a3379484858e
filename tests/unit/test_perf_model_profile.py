"""ProfileModel: a step's fixed cost paid once, decode fit, server overhead (orchestrator/sim/perf_model.py)."""

import json

import pytest

from orchestrator.sim.perf_model import Batch, ProfileModel

PREFILL = [(100, 0.012), (1000, 0.102)]  # 2 ms fixed + 0.1 ms a token
DECODE = {
    b: [(100, 0.002 + 0.0001 * b + 1e-7 * b * 100), (1000, 0.002 + 0.0001 * b + 1e-7 * b * 1000)] for b in (1, 4, 16)
}


def test_a_hand_built_profile_keeps_the_old_model():
    m = ProfileModel(PREFILL, DECODE)
    assert m.step_fixed_s == 0.0
    # two prompts: the sum of their batch-1 times
    assert m.step_time(Batch(prefill=((100, 0), (100, 0)))) == pytest.approx(0.024)
    assert m.step_time(Batch()) == 0.0


def test_prompts_in_one_step_share_its_fixed_cost():
    m = ProfileModel(PREFILL, DECODE, step_fixed_s=0.002)
    assert m.step_time(Batch(prefill=((100, 0),))) == pytest.approx(0.012)
    assert m.step_time(Batch(prefill=((100, 0),) * 4)) == pytest.approx(0.002 + 4 * 0.010)


def test_decoding_sequences_riding_a_prefill_add_their_step_less_the_fixed_cost():
    m = ProfileModel(PREFILL, DECODE, step_fixed_s=0.002)
    decode = m.decode_time(4, 100)
    assert m.step_time(Batch(prefill=((100, 0),), decode_contexts=(100,) * 4)) == pytest.approx(0.012 + decode - 0.002)
    assert m.step_time(Batch(decode_contexts=(100,) * 4)) == pytest.approx(decode)


def test_decode_fit_recovers_a_linear_engine():
    m = ProfileModel(PREFILL, DECODE, decode_fit=True)
    assert m.decode_time(8, 500) == pytest.approx(0.002 + 0.0001 * 8 + 1e-7 * 8 * 500, rel=1e-6)


def _profile(tmp_path, prefill_batch_s: float, server: dict | None = None):
    doc = {
        "prefill": [{"tokens": t, "seconds": s} for t, s in PREFILL],
        "prefill_batch": [{"batch": 4, "tokens": 100, "seconds": prefill_batch_s}],
        "decode": [{"batch": b, "context": c, "step_seconds": s} for b, pts in DECODE.items() for c, s in pts],
        "server": server or {"request_overhead_s": 0.007},
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return ProfileModel.load(path)


def test_load_takes_the_shared_prefill_cost_from_prefill_batches_and_the_server_overhead(tmp_path):
    # 4 prompts of 100 tokens together: 2 ms shared once + 4 x 10 ms; a step costs at least its
    # fixed cost, the decode intercept (b=1, no context: 2.1 ms).
    m = _profile(tmp_path, 0.042)
    assert m.step_fixed_s == pytest.approx(0.0021)
    assert m.prefill_shared_s == pytest.approx(0.0021)
    assert m.request_overhead_s == pytest.approx(0.007)
    assert m.decode_fit


def test_a_prefill_cost_shared_beyond_a_decode_step_is_not_charged_to_decode_steps(tmp_path):
    # 4 x 100 tokens in 22 ms against 4 x 12 ms alone: 8.67 ms of each batch-1 prefill is shared,
    # four times a decode step (2.1 ms): decode steps keep their measured time.
    m = _profile(tmp_path, 0.022)
    assert m.prefill_shared_s == pytest.approx((4 * 0.012 - 0.022) / 3)
    assert m.step_fixed_s == pytest.approx(0.0021)
    assert m.step_time(Batch(decode_contexts=(100,))) == pytest.approx(m.decode_time(1, 100))
    assert m.step_time(Batch(prefill=((100, 0),))) == pytest.approx(0.012)
    assert m.step_time(Batch(prefill=((100, 0),) * 4)) == pytest.approx(0.022)
    decode = m.decode_time(4, 100)
    assert m.step_time(Batch(prefill=((100, 0),), decode_contexts=(100,) * 4)) == pytest.approx(0.012 + decode - 0.0021)


def test_without_prefill_batches_the_fixed_cost_is_the_decode_step_of_nothing(tmp_path):
    doc = {
        "prefill": [{"tokens": t, "seconds": s} for t, s in PREFILL],
        "decode": [{"batch": b, "context": c, "step_seconds": s} for b, pts in DECODE.items() for c, s in pts],
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert ProfileModel.load(path).step_fixed_s == pytest.approx(0.0021)


def test_a_step_with_prompts_and_decodes_pays_what_the_mixed_points_measured_beyond_the_sum(tmp_path):
    # A 100-token prompt while 4 sequences (context 100) decode answered in 3 ms more than the modelled
    # mixed step plus half a decode step (the mean wait for the running one); another point 1 ms more.
    m = _profile(tmp_path, 0.042)
    mixed_step = m.step_time(Batch(prefill=((100, 0),), decode_contexts=(100,) * 4))
    wait = m.decode_time(4, 100) / 2
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["mixed"] = [
        {"batch": 4, "context": 100, "tokens": 100, "seconds": mixed_step + wait + x} for x in (0.001, 0.003, 0.003)
    ]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    mixed = ProfileModel.load(tmp_path / "p.json")
    assert mixed.mixed_extra_s == pytest.approx(0.003)
    assert mixed.step_time(Batch(prefill=((100, 0),), decode_contexts=(100,) * 4)) == pytest.approx(mixed_step + 0.003)
    assert mixed.step_time(Batch(prefill=((100, 0),))) == pytest.approx(m.step_time(Batch(prefill=((100, 0),))))
    assert mixed.step_time(Batch(decode_contexts=(100,) * 4)) == pytest.approx(m.decode_time(4, 100))
    doc["mixed"] = [{"batch": 4, "context": 100, "tokens": 100, "seconds": mixed_step}]  # faster than modelled
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert ProfileModel.load(tmp_path / "p.json").mixed_extra_s == 0.0


def test_a_mixed_point_is_judged_against_its_prompt_timed_alone_around_it_not_the_earlier_prefill(tmp_path):
    # The machine ran 5 ms slower while the point was measured: the prompt took 5 ms more alone too,
    # so mixing cost 2 ms, not 7.
    m = _profile(tmp_path, 0.042)
    mixed_step = m.step_time(Batch(prefill=((100, 0),), decode_contexts=(100,) * 4))
    wait = m.decode_time(4, 100) / 2
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["mixed"] = [
        {
            "batch": 4,
            "context": 100,
            "tokens": 100,
            "seconds": mixed_step + wait + 0.007,
            "alone_seconds": m.prefill_time(100) + 0.005,
        }
    ]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert ProfileModel.load(tmp_path / "p.json").mixed_extra_s == pytest.approx(0.002)


def test_a_scaled_model_is_the_same_engine_that_much_slower(tmp_path):
    m = _profile(tmp_path, 0.036)
    m.mixed_extra_s = 0.001
    slow = m.scaled(1.5)
    for batch in (
        Batch(prefill=((100, 0),)),
        Batch(prefill=((500, 0),) * 3),
        Batch(decode_contexts=(300,) * 8),
        Batch(prefill=((200, 0),), decode_contexts=(100,) * 4),
    ):
        assert slow.step_time(batch) == pytest.approx(1.5 * m.step_time(batch))
    assert slow.request_overhead_s == pytest.approx(1.5 * m.request_overhead_s)
    busy = _profile(tmp_path, 0.036, {"request_overhead_s": 0.007, "request_overhead_busy_s": 0.016})
    assert busy.scaled(1.5).request_overhead(server_busy=True) == pytest.approx(0.024)
    assert m.scaled(1.0).step_time(Batch(decode_contexts=(300,) * 8)) == pytest.approx(m.decode_time(8, 300))


def test_a_request_reaching_a_busy_server_pays_its_busy_cost_and_without_one_the_idle_cost(tmp_path):
    m = _profile(tmp_path, 0.036, {"request_overhead_s": 0.007, "request_overhead_busy_s": 0.016})
    assert m.request_overhead(server_busy=False) == pytest.approx(0.007)
    assert m.request_overhead(server_busy=True) == pytest.approx(0.016)
    older = _profile(tmp_path, 0.036)  # profiled before the busy cost was measured
    assert older.request_overhead(server_busy=True) == older.request_overhead(server_busy=False) == pytest.approx(0.007)
