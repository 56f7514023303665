"""Frames: encoding, limits, and strict decoding of hostile input."""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from blob_server.wire import protocol
from blob_server.wire.protocol import (
    MAX_FRAME_BYTES,
    FrameTooLargeError,
    ProtocolError,
    parse_request,
    parse_response,
)


def ok_frame(request_id: int, result: object) -> bytes:
    return b"".join(protocol.FramePacker().ok(request_id, result))


def body(frame: bytes) -> bytes:
    (length,) = protocol.LENGTH.unpack(frame[:4])
    assert length == len(frame) - 4
    return frame[4:]


def test_request_round_trip():
    frame = protocol.request_frame(7, "get_blobs", {"database": "main", "ids": [b"\x01" * 16]})
    request = parse_request(body(frame))
    assert request == protocol.Request(7, "get_blobs", {"database": "main", "ids": [b"\x01" * 16]})


def test_response_round_trip():
    ok = parse_response(body(ok_frame(3, {"blobs": {b"k" * 16: b"v"}, "deferred": []})))
    assert ok.ok and ok.request_id == 3 and ok.result["blobs"] == {b"k" * 16: b"v"}
    err = parse_response(body(protocol.error_frame(4, "bad_request", "nope")))
    assert not err.ok and err.result == ("bad_request", "nope")


def test_error_message_is_truncated():
    err = parse_response(body(protocol.error_frame(1, "x", "m" * 100_000)))
    assert len(err.result[1]) == protocol.MAX_MESSAGE_LENGTH


def test_oversized_header_is_refused_before_reading():
    with pytest.raises(FrameTooLargeError):
        protocol.check_length(protocol.LENGTH.pack(MAX_FRAME_BYTES + 1))
    assert protocol.check_length(protocol.LENGTH.pack(MAX_FRAME_BYTES)) == MAX_FRAME_BYTES


def test_oversized_frame_is_not_built():
    with pytest.raises(FrameTooLargeError):
        ok_frame(1, b"x" * (MAX_FRAME_BYTES + 1))


frame_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(frame_values, min_size=1, max_size=5))
def test_a_kept_packer_packs_every_frame_as_packb_does(values):
    """The packer's buffer is reused: no frame may carry bytes of the one before it."""
    packer = protocol.FramePacker()
    for rid, value in enumerate(values, 1):
        header, frame_body = packer.ok(rid, value)
        assert frame_body == msgpack.packb([rid, protocol.OK, value], use_bin_type=True)
        assert header == protocol.LENGTH.pack(len(frame_body))


BIN_SIZES = [0, 1, 255, 256, 65535, 65536, 70000]  # both ends of each bin header class


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, protocol.MAX_REQUEST_ID),
    st.dictionaries(  # mixed sizes
        st.binary(min_size=16, max_size=16) | st.binary(max_size=300),
        st.sampled_from(BIN_SIZES).map(lambda n: b"v" * n),
        max_size=6,
    )
    | st.tuples(st.integers(0, 300), st.sampled_from(BIN_SIZES)).flatmap(  # one size of each
        lambda sizes: st.dictionaries(
            st.binary(min_size=sizes[0], max_size=sizes[0]),
            st.just(b"w" * sizes[1]),
            min_size=1,
            max_size=6,
        )
    ),
    st.lists(st.binary(min_size=16, max_size=16), max_size=3),
)
def test_a_blobs_answer_is_sent_as_the_bytes_packb_gives(request_id, blobs, deferred):
    """The answer is built from pieces that refer to the blobs; joined, they must be the
    frame msgpack itself would make, for every size class of msgpack's bin header, with
    ids and blobs of one size each (headers made once) or of several."""
    packer = protocol.FramePacker()
    pieces = packer.ok(request_id, protocol.BlobsResult(blobs, deferred))
    expected = msgpack.packb(
        [request_id, protocol.OK, {"blobs": blobs, "deferred": deferred}], use_bin_type=True
    )
    assert b"".join(pieces) == protocol.LENGTH.pack(len(expected)) + expected
    assert all(any(piece is blob for piece in pieces) for blob in blobs.values() if blob)


def test_a_packer_survives_a_failed_and_a_huge_frame():
    packer = protocol.FramePacker()
    with pytest.raises(TypeError):
        packer.ok(1, {"x": object()})  # not a protocol value
    big = b"b" * (protocol.FramePacker.KEEP_BYTES + 1)
    assert parse_response(packer.ok(2, big)[1]) == protocol.Response(2, True, big)
    assert packer.request(3, "ping", {}) == (
        protocol.LENGTH.pack(len(body(protocol.request_frame(3, "ping", {})))),
        body(protocol.request_frame(3, "ping", {})),
    )
    with pytest.raises(FrameTooLargeError):
        packer.ok(4, b"x" * (MAX_FRAME_BYTES + 1))
    assert parse_response(packer.ok(5, "after")[1]) == protocol.Response(5, True, "after")


@pytest.mark.parametrize(
    "obj",
    [
        None,
        1,
        "get_root",
        [],
        [1, "ping"],
        [1, "ping", {}, 4],
        [-1, "ping", {}],
        [2**63, "ping", {}],
        [True, "ping", {}],
        [1.0, "ping", {}],
        ["1", "ping", {}],
        [1, 2, {}],
        [1, "", {}],
        [1, "x" * 33, {}],
        [1, b"ping", {}],
        [1, "ping", []],
        [1, "ping", None],
        [1, "ping", {b"database": "main"}],
    ],
)
def test_malformed_requests_raise_protocol_error(obj):
    with pytest.raises(ProtocolError):
        parse_request(msgpack.packb(obj, use_bin_type=True))


def test_request_id_is_kept_when_readable():
    with pytest.raises(ProtocolError) as info:
        parse_request(msgpack.packb([42, "ping", []]))
    assert info.value.request_id == 42


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x93\x01",  # array of 3, truncated
        b"\xdd\xff\xff\xff\xff",  # array of 4 billion elements, no data
        b"\xc6\xff\xff\xff\xff",  # bin of 4 GiB, no data
        msgpack.packb([1, "ping", {"x": msgpack.ExtType(5, b"abc")}]),  # ext types refused
        b"\x91" * 100_000 + b"\x01",  # deeply nested arrays
        msgpack.packb([1, "ping", {}]) + b"trailing",
        msgpack.packb([1, "ping", {1: 2}]),  # int map keys
    ],
)
def test_garbage_bodies_raise_protocol_error(raw):
    with pytest.raises(ProtocolError):
        parse_request(raw)


@pytest.mark.parametrize(
    "obj",
    [
        [1, "maybe", None],
        [1, "error", "boom"],
        [1, "error", {"code": 1, "message": "m"}],
        [1, "error", {"code": "c"}],
        ["1", "ok", None],
        [1, "ok"],
    ],
)
def test_malformed_responses_raise_protocol_error(obj):
    with pytest.raises(ProtocolError):
        parse_response(msgpack.packb(obj, use_bin_type=True))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_never_escape_as_other_exceptions(raw):
    try:
        request = parse_request(raw)
    except ProtocolError:
        return
    assert type(request.args) is dict and type(request.op) is str


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(msgpack_values, max_size=4))
def test_random_structures_never_escape_as_other_exceptions(obj):
    raw = msgpack.packb(obj, use_bin_type=True)
    for parse in (parse_request, parse_response):
        with contextlib.suppress(ProtocolError):
            parse(raw)


def test_login_digest_separates_fields():
    base = protocol.login_digest("srv", "ab", b"\x02" * 33, b"n" * 32, 100)
    assert len(base) == 32
    assert base != protocol.login_digest("srv", "a", b"b" + b"\x02" * 33, b"n" * 32, 100)
    assert base != protocol.login_digest("srva", "b", b"\x02" * 33, b"n" * 32, 100)
    assert base != protocol.login_digest("srv", "ab", b"\x02" * 33, b"n" * 32, 101)
    assert base != protocol.login_digest("srv", "ab", b"\x02" * 33, b"m" * 32, 100)


@pytest.mark.parametrize(
    "frame",
    [
        (b"\x00\x00\x00\x02", b"ok"),  # small: joined
        (b"head", b"x" * 100_000),  # large, two pieces: the body goes with the header
        (b"head", b"a" * 70_000, b"b" * 10, b"tail"),  # last blob small: joined to the tail
        (b"head", b"a" * 10, b"b" * 90_000, b"tail"),  # last blob large: sent as it is
        (b"head", memoryview(b"v" * 80_000), memoryview(b"w" * 16_384), b"tail"),
    ],
)
def test_write_frame_sends_the_pieces_in_order(frame):
    expected = b"".join(frame)

    async def exchange() -> bytes:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert protocol.write_frame(writer, frame)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        data = await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return data

    assert asyncio.run(exchange()) == expected


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(
    "frame", [(b"\x00\x00\x00\x02", b"ok"), (b"head", b"x" * 100_000, b"tail")]
)
def test_write_frame_refuses_a_closing_connection(loop, frame):
    """Small frames too: the server closes a subscribed connection whose root changes
    were lost while a request on it may still be answered, and uvloop's transport
    raises RuntimeError on a write after close (seen when a whole Redis Cluster was
    killed under commits: the connection ended as an internal error)."""

    async def exchange() -> bool:
        done = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()
            done.set_result(protocol.write_frame(writer, frame))

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        result = await done
        writer.close()
        server.close()
        await server.wait_closed()
        return result

    factory = uvloop.new_event_loop if loop == "uvloop" else None
    assert asyncio.run(exchange(), loop_factory=factory) is False
