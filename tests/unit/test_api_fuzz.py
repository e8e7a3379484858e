"""Property-based fuzzing of the HTTP API: whatever the body, the answer is a
2xx or an OpenAI-style 4xx, never a 5xx or a crash, and the server keeps
serving."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import MODEL, make_frontend, run

FE = make_frontend(max_model_len=128)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                      max_leaves=20)
known = {
    "model": st.one_of(st.just(MODEL), st.text(max_size=10)),
    "prompt": st.one_of(st.text(max_size=60), st.lists(st.integers(-5, 2000), max_size=20), values),
    "messages": st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]),
                                                          "content": st.one_of(st.text(max_size=30), values)}),
                                   max_size=3), values),
    "max_tokens": st.one_of(st.integers(-5, 500), values),
    "temperature": st.one_of(st.floats(-1, 3), values),
    "stream": st.one_of(st.booleans(), values),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=20), values),
    "n": st.integers(-1, 3),
    "logprobs": values,
}
bodies = st.one_of(
    st.fixed_dictionaries({}, optional=known),
    st.dictionaries(st.text(max_size=12), values, max_size=6),
    values,
)


def _check(response):
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_json_bodies_never_cause_a_server_error(body, path):
    async def go():
        async with FE.client() as c:
            return await c.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})

    _check(run(go()))


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_cause_a_server_error(raw):
    async def go():
        async with FE.client() as c:
            return await c.post("/v1/completions", content=raw)

    _check(run(go()))


def test_the_server_still_serves_after_the_fuzzing():
    async def go():
        async with FE.client() as c:
            return await c.post("/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 2})

    assert run(go()).status_code == 200
