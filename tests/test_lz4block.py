"""lz4-java LZ4Block framing: Spark 4.3.0 vectors, round trips, every corruption we detect, and
(``spark`` marker) byte-level agreement with the JVM's ``LZ4CompressionCodec``."""

from __future__ import annotations

import os
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from statectl.codecs.lz4block import (
    CHECKSUM_SEED,
    HEADER,
    MAGIC,
    block_level,
    checksum,
    decode_lz4_block_stream,
    encode_lz4_block_stream,
)
from statectl.errors import CorruptFileError

# shared/docs/spark-state-format.md §5.1 / §13.1: state/0/0/1.delta of an aggregation, key "a"
ONE_RECORD_DELTA = bytes.fromhex(
    "4c5a34426c6f636b" "25" "26000000" "3c000000" "c1186e07"
    "53000000180001009301000000100000006110000c1c000002000024008000000000ffffffff"
    "4c5a34426c6f636b" "15" "00000000" "00000000" "00000000"
)  # fmt: skip
ONE_RECORD_PAYLOAD = bytes.fromhex(
    "00000018" "000000000000000001000000100000006100000000000000"
    "00000018" "000000000000000001000000000000000100000000000000"
    "ffffffff"
)  # fmt: skip
EMPTY_DELTA = bytes.fromhex(
    "4c5a34426c6f636b" "15" "04000000" "04000000" "db804d08" "ffffffff"
    "4c5a34426c6f636b" "15" "00000000" "00000000" "00000000"
)  # fmt: skip
END_MARK = MAGIC + bytes([0x15]) + bytes(12)
PATH = "state/0/0/1.delta"


def test_doc_vectors() -> None:
    assert len(ONE_RECORD_DELTA) == 80 and len(EMPTY_DELTA) == 46
    assert decode_lz4_block_stream(ONE_RECORD_DELTA) == ONE_RECORD_PAYLOAD
    assert len(ONE_RECORD_PAYLOAD) == 60
    assert decode_lz4_block_stream(EMPTY_DELTA) == b"\xff\xff\xff\xff"
    # The empty delta is a RAW block, so our writer reproduces Spark's file byte for byte.
    assert encode_lz4_block_stream(b"\xff\xff\xff\xff") == EMPTY_DELTA
    assert checksum(b"\xff\xff\xff\xff") == 0x084D80DB
    assert checksum(b"\xff\xff\xff\xff") == (
        xxhash.xxh32_intdigest(b"\xff\xff\xff\xff", seed=0x9747B28C) & 0x0FFFFFFF
    )
    assert CHECKSUM_SEED == 0x9747B28C


def test_one_record_reencodes_to_a_valid_lz4_block() -> None:
    # python-lz4 compresses this 60-byte block to 35 bytes where lz4-java wrote 38: different
    # but valid bytes, same header fields otherwise.
    ours = encode_lz4_block_stream(ONE_RECORD_PAYLOAD)
    assert decode_lz4_block_stream(ours) == ONE_RECORD_PAYLOAD
    magic, token, clen, dlen, check = HEADER.unpack_from(ours, 0)
    assert (magic, token, dlen, check) == (MAGIC, 0x25, 60, 0x076E18C1)
    assert clen < 60
    assert ours.endswith(END_MARK)


def test_block_level_matches_lz4_java() -> None:
    assert block_level(32 * 1024) == 5
    assert block_level(64) == 0
    assert block_level(1024) == 0
    assert block_level(1025) == 1
    assert block_level(64 * 1024) == 6
    assert block_level(32 * 1024 * 1024) == 15
    for bad in (63, 32 * 1024 * 1024 + 1):
        with pytest.raises(ValueError):
            block_level(bad)


def _blocks(stream: bytes) -> list[tuple[int, int, int, int]]:
    """(token, compressed, decompressed, checksum) of every block header."""
    out, pos = [], 0
    while pos < len(stream):
        _, token, clen, dlen, check = HEADER.unpack_from(stream, pos)
        out.append((token, clen, dlen, check))
        pos += HEADER.size + clen
    return out


@given(st.binary(max_size=200_000), st.sampled_from([64, 1000, 1024, 32 * 1024, 64 * 1024]))
@settings(max_examples=60, deadline=None)
def test_round_trip_and_framing(raw: bytes, block_size: int) -> None:
    stream = encode_lz4_block_stream(raw, block_size)
    assert decode_lz4_block_stream(stream, PATH) == raw
    assert decode_lz4_block_stream(memoryview(stream), PATH) == raw
    blocks = _blocks(stream)
    level = block_level(block_size)
    assert blocks[-1] == (0x10 | level, 0, 0, 0)  # the end mark
    assert sum(b[2] for b in blocks) == len(raw)
    for token, clen, dlen, _ in blocks[:-1]:
        assert token & 0x0F == level and 0 < dlen <= block_size
        assert token & 0xF0 in (0x10, 0x20)
        assert clen == dlen if token & 0xF0 == 0x10 else clen < dlen  # RAW unless smaller


def test_raw_when_incompressible_lz4_otherwise() -> None:
    noise = os.urandom(5000)
    assert [b[0] for b in _blocks(encode_lz4_block_stream(noise))] == [0x15, 0x15]
    assert [b[0] for b in _blocks(encode_lz4_block_stream(b"ab" * 5000))] == [0x25, 0x15]


def test_concatenated_streams_and_empty_stream() -> None:
    a, b = os.urandom(100), b"xyz" * 3000
    both = encode_lz4_block_stream(a) + encode_lz4_block_stream(b, 1024)
    assert decode_lz4_block_stream(both) == a + b
    assert decode_lz4_block_stream(END_MARK) == b""
    assert decode_lz4_block_stream(END_MARK + END_MARK + EMPTY_DELTA) == b"\xff\xff\xff\xff"


def _corrupt(stream: bytes, pos: int, value: int) -> bytes:
    return stream[:pos] + bytes([value]) + stream[pos + 1 :]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_corrupt(EMPTY_DELTA, 22, 0x00), "LZ4 block at byte 0: checksum mismatch"),
        (_corrupt(ONE_RECORD_DELTA, 40, 0x7A), "LZ4 block at byte 0"),
        (_corrupt(EMPTY_DELTA, 0, ord("X")), "LZ4 block at byte 0: bad magic"),
        (_corrupt(EMPTY_DELTA, 8, 0x35), "unknown compression method 0x30"),
        (_corrupt(EMPTY_DELTA, 9, 0x05), "inconsistent lengths"),  # RAW with clen != dlen
        (_corrupt(EMPTY_DELTA, 25 + 17, 0x01), "end mark with a nonzero checksum"),
        (_corrupt(EMPTY_DELTA, 20, 0x18), "checksum mismatch"),  # top bits set: Java rejects
        (EMPTY_DELTA[:-1], "truncated: stream ends inside a block header at byte 25"),
        (EMPTY_DELTA[:10], "truncated: stream ends inside a block header at byte 0"),
        (EMPTY_DELTA[:23], "truncated: LZ4 block at byte 0 needs 4 payload bytes, only 2 remain"),
        (EMPTY_DELTA[:25], "missing LZ4 end mark"),
        (b"", "missing LZ4 end mark: the file is empty"),
    ],
)
def test_corruption_is_reported_with_the_path(data: bytes, message: str) -> None:
    with pytest.raises(CorruptFileError, match=message) as info:
        decode_lz4_block_stream(data, PATH)
    assert str(info.value).startswith(f"{PATH}: ")


def test_block_larger_than_its_token_allows() -> None:
    raw = os.urandom(2048)
    stream = encode_lz4_block_stream(raw, 2048)  # token level 1: up to 2048 bytes
    assert decode_lz4_block_stream(stream) == raw
    with pytest.raises(CorruptFileError, match="token allows 1024"):
        decode_lz4_block_stream(_corrupt(stream, 8, stream[8] - 1))


@pytest.mark.parametrize(
    ("claimed", "message"),
    [
        (999, "does not decompress to 999 bytes"),
        (2000, "decompresses to 1000 bytes, header says 2000"),
    ],
)
def test_lz4_payload_with_wrong_length(claimed: int, message: str) -> None:
    stream = bytearray(encode_lz4_block_stream(b"ab" * 500))
    struct.pack_into("<i", stream, 13, claimed)
    with pytest.raises(CorruptFileError, match=f"LZ4 block at byte 0: payload {message}"):
        decode_lz4_block_stream(bytes(stream), PATH)


@given(st.binary(min_size=1, max_size=3000), st.data())
@settings(max_examples=150, deadline=None)
def test_any_truncation_is_an_error(raw: bytes, data: st.DataObject) -> None:
    stream = encode_lz4_block_stream(raw, 256)
    cut = data.draw(st.integers(0, len(stream) - 1))
    with pytest.raises(CorruptFileError):
        decode_lz4_block_stream(stream[:cut], PATH)


@given(st.binary(min_size=1, max_size=3000), st.data())
@settings(max_examples=300, deadline=None)
def test_a_flipped_byte_is_detected_or_harmless(raw: bytes, data: st.DataObject) -> None:
    stream = encode_lz4_block_stream(raw, 256)
    pos = data.draw(st.integers(0, len(stream) - 1))
    flip = data.draw(st.integers(1, 255))
    try:
        out = decode_lz4_block_stream(_corrupt(stream, pos, stream[pos] ^ flip), PATH)
    except CorruptFileError:
        return
    assert out == raw  # e.g. a lower level nibble that still admits the block


# -- against the JVM ---------------------------------------------------------------------------
def _jvm_codec(spark):  # type: ignore[no-untyped-def]
    conf = spark.sparkContext._jsc.sc().conf()
    return spark._jvm.org.apache.spark.io.CompressionCodec.createCodec(conf, "lz4")


def _jvm_compress(spark, raw: bytes) -> bytes:  # type: ignore[no-untyped-def]
    bos = spark._jvm.java.io.ByteArrayOutputStream()
    out = _jvm_codec(spark).compressedOutputStream(bos)
    out.write(bytearray(raw))
    out.close()
    return bytes(bos.toByteArray())


def _jvm_decompress(spark, data: bytes) -> bytes:  # type: ignore[no-untyped-def]
    source = spark._jvm.java.io.ByteArrayInputStream(bytearray(data))
    stream = _jvm_codec(spark).compressedInputStream(source)
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()


@pytest.mark.spark
def test_jvm_writes_the_doc_vectors(spark) -> None:  # type: ignore[no-untyped-def]
    assert _jvm_compress(spark, ONE_RECORD_PAYLOAD) == ONE_RECORD_DELTA
    assert _jvm_compress(spark, b"\xff\xff\xff\xff") == EMPTY_DELTA
    assert _jvm_compress(spark, b"") == END_MARK


@pytest.mark.spark
@given(st.lists(st.one_of(st.binary(max_size=5000), st.sampled_from([b"ab" * 40000])), max_size=4))
@settings(max_examples=15, deadline=None)
def test_jvm_round_trips(spark, payloads: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    for raw in payloads:
        assert decode_lz4_block_stream(_jvm_compress(spark, raw)) == raw
        assert _jvm_decompress(spark, encode_lz4_block_stream(raw)) == raw


@pytest.mark.spark
def test_jvm_rejects_what_we_reject(spark) -> None:  # type: ignore[no-untyped-def]
    from py4j.protocol import Py4JJavaError

    for bad in (_corrupt(EMPTY_DELTA, 22, 0x00), _corrupt(EMPTY_DELTA, 20, 0x18)):
        with pytest.raises(Py4JJavaError, match="Stream is corrupted"):
            _jvm_decompress(spark, bad)
