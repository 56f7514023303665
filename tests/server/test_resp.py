"""The MGET reader of blob_server.storage.resp: its parser on every split of a reply and on
hostile bytes, and the reader itself against a real redis-server (AUTH, SELECT, long key
lists, big values, a restart, a pause, a connection limit)."""

from __future__ import annotations

import asyncio
import os

import hiredis
import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blob_server.exceptions import StorageUnavailableError
from blob_server.storage import RedisStorage
from blob_server.storage.resp import (
    KEEP_BYTES,
    MGET_CHUNK,
    RespBlobReader,
    RespError,
    RespProtocolError,
    _Connection,
    _Mget,
    _mget_command,
)
from blob_server.storage.validation import MAX_BLOB_SIZE
from tests.server.conftest import start_redis_server, stop_redis_server
from tests.server.test_storage import new_id


def resp_array(values: list[bytes | None]) -> bytes:
    """An MGET reply as Redis writes it."""
    out = [b"*%d\r\n" % len(values)]
    for value in values:
        out.append(b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value))
    return b"".join(out)


def parse_in_pieces(data: bytes, count: int, cuts: list[int], stale: bytes = b"") -> object:
    """Feed ``data`` to an ``_Mget`` as it would arrive, in pieces ending at ``cuts``, in
    a buffer whose bytes past the arrived ones are ``stale`` repeated (what an earlier
    reply left there: the parser must never read them)."""
    parser = _Mget(count)
    buffer = bytearray((stale * len(data))[: len(data)]) if stale else bytearray(len(data))
    start = 0
    for end in [*sorted(set(cuts)), len(data)]:
        buffer[start:end] = data[start:end]
        done = parser.feed(buffer, start, end)
        if done is not None:
            return done
        start = parser.consumed
    return None


values_lists = st.lists(st.none() | st.binary(max_size=300), max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    values_lists,
    st.lists(st.integers(0, 4000), max_size=6),
    st.sampled_from([b"", b"$", b"\r\n", b"$0\r\n\r\n", b"$3\r\nabc\r\n"]),
)
# A missing value between two of one size: the size of the header seen last must not
# be taken for the missing one's (a bug the shortcut for repeated headers once had).
@example(values=[b"", None, b""], cuts=[], stale=b"")
@example(values=[b"abc", b"abc"], cuts=[10], stale=b"$3\r\nabc\r\n")
def test_a_reply_parses_the_same_however_it_is_split(values, cuts, stale):
    data = resp_array(values)
    assert parse_in_pieces(data, len(values), [c % (len(data) + 1) for c in cuts], stale) == (
        len(data),
        values,
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=30)
    | st.integers(0, 70).flatmap(lambda n: st.lists(st.binary(min_size=n, max_size=n)))
)
def test_the_mget_command_is_what_hiredis_packs(keys):
    """Key lists of one length (every read's) take the join; all must match hiredis."""
    assert _mget_command(keys) == hiredis.pack_command(("MGET", *keys))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 5))
def test_hostile_bytes_raise_only_resp_errors(data, count):
    try:
        done = parse_in_pieces(data, count, [len(data) // 2])
    except (RespError, RespProtocolError):
        return
    if done is not None:  # then it was a well-formed reply of ``count`` values
        end, values = done
        assert resp_array(values) == data[:end] and len(values) == count


@pytest.mark.parametrize(
    ("data", "count"),
    [
        (b"*2\r\n$1\r\na\r\n", 1),  # wrong count
        (b"+OK\r\n", 1),  # not an array
        (b"*1\r\n:5\r\n", 1),  # an integer, not a bulk string
        (b"*1\r\n$ 1\r\na\r\n", 1),  # int() would take the space
        (b"*1\r\n$1_0\r\naaaaaaaaaa\r\n", 1),  # ...and the underscore
        (b"*1\r\n$-2\r\n", 1),
        (b"*1\r\n$1\r\nab\r\n", 1),  # the value overruns its length
        (b"*1\r\n$" + b"9" * 40 + b"\r\n", 1),  # a header longer than any real one
        (b"*" + b"1" * 40, 1),
        (b"*1\r\n$%d\r\n" % (MAX_BLOB_SIZE + 1), 1),  # refused before it is buffered
    ],
)
def test_malformed_replies_are_refused(data, count):
    with pytest.raises(RespProtocolError):
        parse_in_pieces(data, count, [])


def test_an_error_reply_is_raised_with_its_message():
    with pytest.raises(RespError, match="WRONGTYPE nope"):
        parse_in_pieces(b"-WRONGTYPE nope\r\n", 1, [])


def test_a_connection_refuses_bytes_nobody_asked_for():
    conn = _Connection()
    view = conn.get_buffer(-1)
    view[:5] = b"+OK\r\n"
    conn.buffer_updated(5)
    assert conn.lost


# -- against a real Redis -------------------------------------------------------------------


def reader_for(url: str, **kwargs) -> RespBlobReader:
    from redis.connection import parse_url

    options = {"socket_timeout": 5.0, "connect_timeout": 2.0, "max_connections": None}
    options.update(kwargs)
    return RespBlobReader(parse_url(url), url=url, **options)


def test_values_come_back_in_order_with_none_for_missing_keys(redis_server):
    client = redis_server.client()
    values = {b"k%d" % i: os.urandom(i * 100) for i in range(50)}  # k0 is empty
    client.mset(values)
    keys = [*values, b"missing"]
    got = asyncio.run(reader_for(redis_server.url()).mget(keys))
    assert got == [*values.values(), None]


def test_values_are_read_only_views_that_stay_intact_while_they_are_kept(redis_server):
    """Values are views of a connection's buffer, not copies: a buffer must not take the
    next reply while any view of it is kept, whatever the reads in between."""
    client = redis_server.client()
    reader = reader_for(redis_server.url())

    async def reads() -> list:
        kept = []
        for i in range(10):
            client.set(b"k", bytes([i]) * (1000 + i * 50_000))  # also grows the buffer
            kept.append(await reader.mget([b"k"]))
            if i % 3 == 0:
                await reader.mget([b"k"])  # a reply whose values are let go at once
        return kept

    kept = asyncio.run(reads())
    assert [values[0] for values in kept] == [bytes([i]) * (1000 + i * 50_000) for i in range(10)]
    view = kept[0][0]
    assert isinstance(view, memoryview) and view.readonly
    with pytest.raises(TypeError):
        view[0] = 1


def test_long_key_lists_go_out_as_several_mgets(redis_server):
    client = redis_server.client()
    keys = [b"long:%d" % i for i in range(2 * MGET_CHUNK + 7)]
    client.mset({key: key[::-1] for key in keys[::3]})
    got = asyncio.run(reader_for(redis_server.url()).mget(keys))
    assert got == [key[::-1] if i % 3 == 0 else None for i, key in enumerate(keys)]


def test_big_values_grow_the_buffer_and_later_reads_still_work(redis_server):
    client = redis_server.client()
    big = os.urandom(KEEP_BYTES + 12345)
    client.mset({b"big": big, b"small": b"s"})
    reader = reader_for(redis_server.url())

    async def reads() -> list:
        return [await reader.mget([b"big", b"small"]), await reader.mget([b"small"])]

    assert asyncio.run(reads()) == [[big, b"s"], [b"s"]]


def test_password_and_database_number_are_followed(tmp_path):
    server = start_redis_server(tmp_path, password="s3cret")
    try:
        admin = redis.Redis(port=server.port, password="s3cret", db=3)
        admin.set(b"k", b"in db 3")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        assert asyncio.run(reader_for(url).mget([b"k"])) == [b"in db 3"]
        # The same through the storage: its keys, its database.
        storage = RedisStorage(url)
        blob = new_id()
        storage.commit("t", "d", expected_seq=0, root=b"r", blobs={blob: b"v"})
        assert asyncio.run(storage.aget_blobs("t", "d", [blob, new_id()])) == {blob: b"v"}
        storage.close()
        wrong = f"redis://:wrong@127.0.0.1:{server.port}/3"
        with pytest.raises(StorageUnavailableError, match="set-up failed"):
            asyncio.run(reader_for(wrong).mget([b"k"]))
    finally:
        stop_redis_server(server.process)


def test_a_redis_restart_is_survived_by_one_retry(tmp_path):
    server = start_redis_server(tmp_path)
    reader = reader_for(server.url())
    loop = asyncio.new_event_loop()
    try:
        server.client().set(b"k", b"before")
        assert loop.run_until_complete(reader.mget([b"k"])) == [b"before"]
        stop_redis_server(server.process)
        with pytest.raises(StorageUnavailableError, match="cannot connect"):
            loop.run_until_complete(reader.mget([b"k"]))
        restarted = start_redis_server(tmp_path)
        reader = reader_for(restarted.url())  # a new port: a new reader, same loop
        restarted.client().set(b"k", b"after")
        assert loop.run_until_complete(reader.mget([b"k"])) == [b"after"]
        # Kill every connection Redis holds: the pooled one is dead, the read retries.
        restarted.client().client_kill_filter(_type="normal", skipme=True)
        assert loop.run_until_complete(reader.mget([b"k"])) == [b"after"]
        stop_redis_server(restarted.process)
    finally:
        loop.close()


def test_a_read_that_outlives_the_timeout_fails_and_the_next_one_works(redis_server):
    client = redis_server.client()
    client.set(b"k", b"v")
    reader = reader_for(redis_server.url(), socket_timeout=0.2)

    async def scenario() -> list:
        client.execute_command("CLIENT", "PAUSE", 600, "ALL")
        with pytest.raises(StorageUnavailableError, match="timed out"):
            await reader.mget([b"k"])
        await asyncio.sleep(0.6)
        return await reader.mget([b"k"])

    assert asyncio.run(scenario()) == [b"v"]


def test_the_connection_limit_holds_under_concurrent_reads(redis_server):
    client = redis_server.client()
    client.set(b"k", b"v" * 100_000)
    reader = reader_for(redis_server.url(), max_connections=2)
    before = len(client.client_list())

    async def many() -> tuple[list, int]:
        reads = [asyncio.ensure_future(reader.mget([b"k"])) for _ in range(20)]
        await asyncio.sleep(0)
        peak = 0
        while not all(r.done() for r in reads):
            peak = max(peak, len(client.client_list()) - before)
            await asyncio.sleep(0)
        return [r.result() for r in reads], peak

    results, peak = asyncio.run(many())
    assert results == [[b"v" * 100_000]] * 20
    # Never more than the limit. (Not "at least one": on a busy machine the reads can all
    # finish before the first look at the client list, which then sees none.)
    assert peak <= 2


def test_url_options_the_reader_cannot_follow_are_refused(redis_server):
    with pytest.raises(StorageUnavailableError, match="client_name"):
        RedisStorage(redis_server.url() + "?client_name=x")


def test_tls_urls_read_through_the_blocking_client(redis_server):
    # A plain Redis behind a rediss:// URL: the handshake fails, and the failure is a
    # StorageUnavailableError from the worker-thread path, as from every other call.
    url = f"rediss://127.0.0.1:{redis_server.port}/0"
    storage = RedisStorage(url, connect_timeout=1, socket_timeout=1)
    with pytest.raises(StorageUnavailableError):
        asyncio.run(storage.aget_blobs("t", "d", [new_id()]))
    storage.close()
