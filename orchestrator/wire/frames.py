"""Frames of the direct data plane and their codec.

    frame   = u32 big-endian length, then msgpack [op, stream_id, payload]
    client  AUTH(proof) | GENERATE(EngineRequest) | PREFILL(EngineRequest) | CANCEL(nil)
    server  CHALLENGE(nonce) | CHUNKS([EngineChunk, ...]) | RESULT(PrefillResult) | END(nil)
            | ERROR([kind, message])

A connection opens with the server's CHALLENGE (a fresh random nonce, stream 0) and the client's AUTH
(`proof(secret, nonce)`, stream 0): the server takes no other frame before a valid proof, and closes the
connection on a wrong or missing one. A new stream's id is above every id the connection used before.
Payloads are the boundary dataclasses of `orchestrator.messages`, decoded
into their types (msgspec checks every field): a peer can send nothing but
these. A stream ends with exactly one of END (after CHUNKS), RESULT or ERROR.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult

HEADER = struct.Struct(">I")
# A frame larger than this is a protocol violation: the connection is dropped.
MAX_FRAME_BYTES = 64 * 2**20


NONCE_BYTES = 32
_PROOF_CONTEXT = b"orchestrator-wire-v1"


class Op(enum.IntEnum):
    GENERATE = 1
    PREFILL = 2
    CANCEL = 3
    CHUNKS = 11
    RESULT = 12
    END = 13
    ERROR = 14
    CHALLENGE = 21
    AUTH = 22


class ErrorKind(str, enum.Enum):
    REJECTED = "rejected"  # the request is invalid (EngineRequestRejected)
    FAILED = "failed"  # the engine or replica failed it (EngineError)
    DRAINING = "draining"  # the replica is shutting down and takes no new requests
    REFUSED = "refused"  # stream 0, then the connection closes: the client's proof failed (another secret)


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


_encoder = msgspec.msgpack.Encoder()
_envelope = msgspec.msgpack.Decoder(tuple[int, int, msgspec.Raw])
_payload_decoders: dict[Op, msgspec.msgpack.Decoder] = {
    Op.GENERATE: msgspec.msgpack.Decoder(EngineRequest),
    Op.PREFILL: msgspec.msgpack.Decoder(EngineRequest),
    Op.CANCEL: msgspec.msgpack.Decoder(None),
    Op.CHUNKS: msgspec.msgpack.Decoder(list[EngineChunk]),
    Op.RESULT: msgspec.msgpack.Decoder(PrefillResult),
    Op.END: msgspec.msgpack.Decoder(None),
    Op.ERROR: msgspec.msgpack.Decoder(tuple[ErrorKind, str]),
    Op.CHALLENGE: msgspec.msgpack.Decoder(bytes),
    Op.AUTH: msgspec.msgpack.Decoder(bytes),
}


def proof(secret: bytes, nonce: bytes) -> bytes:
    """What a client sends for the server's nonce: HMAC-SHA256 of the nonce under the app's secret."""
    return hmac.new(secret, _PROOF_CONTEXT + nonce, hashlib.sha256).digest()


def proves(secret: bytes, nonce: bytes, claimed: bytes) -> bool:
    return hmac.compare_digest(proof(secret, nonce), claimed)


def encode(op: Op, stream_id: int, payload: Any = None) -> bytes:
    body = _encoder.encode((int(op), stream_id, payload))
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into decoded frames: feed() bytes as they arrive,
    `on_frame(op, stream_id, payload)` is called once per whole frame."""

    def __init__(self, on_frame: Callable[[Op, int, Any], None]) -> None:
        self._buffer = bytearray()
        self._on_frame = on_frame

    def feed(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        start = 0
        while len(buf) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, start)
            if size > MAX_FRAME_BYTES:
                raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
            end = start + HEADER.size + size
            if len(buf) < end:
                break
            op, stream_id, payload = self._decode(memoryview(buf)[start + HEADER.size : end])
            start = end
            self._on_frame(op, stream_id, payload)
        del buf[:start]

    @staticmethod
    def _decode(body: memoryview) -> tuple[Op, int, Any]:
        try:
            op_value, stream_id, raw = _envelope.decode(body)
            op = Op(op_value)
            return op, stream_id, _payload_decoders[op].decode(raw)
        except (msgspec.DecodeError, ValueError) as e:
            raise ProtocolError(str(e)) from None
