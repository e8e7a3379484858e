"""Property-based fuzzing of the HTTP API: whatever the body, the answer is a
2xx or an OpenAI-style 4xx, never a 5xx or a crash, and the server keeps
serving."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import MODEL, make_frontend, run

FE = make_frontend(max_model_len=128)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=40)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
known = {
    "model": st.one_of(st.just(MODEL), st.text(max_size=10)),
    "prompt": st.one_of(st.text(max_size=60), st.lists(st.integers(-5, 2000), max_size=20), values),
    "messages": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "x"]), "content": st.one_of(st.text(max_size=30), values)}
            ),
            max_size=3,
        ),
        values,
    ),
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


def _body_with(value: str) -> bytes:
    return f'{{"model": "{MODEL}", "prompt": "a b", "max_tokens": 2, "temperature": {value}}}'.encode()


hostile = st.one_of(
    # nesting far beyond what json's recursion allows, in arrays and objects
    st.integers(500, 150_000).map(lambda d: b'{"model": "m", "prompt": ' + b"[" * d + b"]" * d + b"}"),
    st.integers(500, 50_000).map(lambda d: b'{"a": ' * d + b"1" + b"}" * d),
    # integers past Python's 4,300-digit conversion limit, huge exponents, NaN and infinities
    st.integers(4_000, 60_000).map(lambda n: _body_with("1" * n)),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999999", "-1e-999999", "1" + "0" * 400 + ".5"]).map(_body_with),
    # invalid UTF-8 inside an otherwise well-formed body
    st.binary(min_size=1, max_size=8).map(lambda b: b'{"model": "m", "prompt": "' + b"\xff\xfe" + b + b'"}'),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    raw=hostile,
    content_type=st.sampled_from(
        ["application/json", "text/plain", "multipart/form-data", "application/x-www-form-urlencoded", ""]
    ),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
)
def test_hostile_bodies_get_a_4xx_and_never_a_server_error(raw, content_type, path):
    async def go():
        async with FE.client() as c:
            return await c.post(path, content=raw, headers={"content-type": content_type} if content_type else {})

    response = run(go())
    _check(response)
    assert response.status_code < 500


def test_nan_and_infinite_numbers_are_refused_as_invalid_json():
    async def go(value):
        async with FE.client() as c:
            return await c.post(
                "/v1/completions", content=_body_with(value), headers={"content-type": "application/json"}
            )

    for value in ("NaN", "Infinity", "-Infinity", "1e999999"):
        response = run(go(value))
        assert response.status_code == 400, (value, response.text)
        assert "not valid JSON" in response.json()["error"]["message"]
