"""Codec streams (lz4, zstd, snappy, lzf): names, round trips, framing details, corruption, and
(``spark`` marker) round trips through the JVM's own ``CompressionCodec`` in both directions."""

from __future__ import annotations

import os
import struct

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from statectl.codecs.compression import (
    CODECS,
    SNAPPY_HEADER,
    compress_stream,
    decompress_stream,
    lzf_decompress_block,
    normalize_codec,
)
from statectl.errors import CorruptFileError, UnsupportedError

PATH = "state/0/0/1.delta"
# Written by Spark 4.3.0's codecs (py4j, CompressionCodec.createCodec(conf, name)).
JVM_VECTORS = {
    ("snappy", b""): "82534e41505059000000000100000001",
    ("snappy", b"\xff\xff\xff\xff"): "82534e4150505900000000010000000100000006040cffffffff",
    ("snappy", b"abc" * 10): "82534e41505059000000000100000001000000081e086162636a0300",
    ("lzf", b"\xff\xff\xff\xff"): "5a56000004ffffffff",
    ("lzf", b"abc" * 10): "5a5601000a001e02616263e01002016263",
    ("zstd", b""): "28b52ffd2000010000",
    ("zstd", b"\xff\xff\xff\xff"): "28b52ffd0048200000ffffffff010000",
    ("zstd", b"abc" * 10): "28b52ffd00484c0000186162630100866e08010000",
}
payloads = st.one_of(
    st.binary(min_size=1, max_size=70_000),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=20), st.integers(1, 9000)),
)


def test_codec_names() -> None:
    assert CODECS == ("lz4", "zstd", "snappy", "lzf")
    for name in CODECS:
        assert normalize_codec(name) == name
        assert normalize_codec(name.upper()) == name  # Spark lower-cases short names
    assert normalize_codec(" lz4 ") == "lz4"
    assert normalize_codec("org.apache.spark.io.LZ4CompressionCodec") == "lz4"
    assert normalize_codec("org.apache.spark.io.ZStdCompressionCodec") == "zstd"
    assert normalize_codec("org.apache.spark.io.SnappyCompressionCodec") == "snappy"
    assert normalize_codec("org.apache.spark.io.LZFCompressionCodec") == "lzf"
    for bad in ("gzip", "org.apache.spark.io.lz4compressioncodec", "com.example.MyCodec", ""):
        with pytest.raises(UnsupportedError, match="unsupported state store compression codec"):
            normalize_codec(bad)


@pytest.mark.parametrize("codec", CODECS)
@given(raw=payloads)
@settings(max_examples=40, deadline=None)
def test_round_trip(codec: str, raw: bytes) -> None:
    assert decompress_stream(codec, compress_stream(codec, raw), PATH) == raw


@pytest.mark.parametrize(("codec", "raw"), sorted(JVM_VECTORS))
def test_reads_jvm_vectors(codec: str, raw: bytes) -> None:
    assert decompress_stream(codec, bytes.fromhex(JVM_VECTORS[(codec, raw)])) == raw


def test_writer_framings() -> None:
    assert SNAPPY_HEADER.hex() == "82534e41505059000000000100000001"
    assert compress_stream("snappy", b"") == SNAPPY_HEADER  # what snappy-java writes
    assert (
        compress_stream("snappy", b"\xff\xff\xff\xff").hex()
        == JVM_VECTORS[("snappy", b"\xff\xff\xff\xff")]
    )
    # LZF: stored chunks ('ZV', 0, uint16 length) of at most 65535 bytes; nothing for no data.
    assert (
        compress_stream("lzf", b"\xff\xff\xff\xff").hex()
        == JVM_VECTORS[("lzf", b"\xff\xff\xff\xff")]
    )
    assert compress_stream("lzf", b"") == b""
    big = compress_stream("lzf", bytes(70_000))
    assert big[:5] == b"ZV\x00\xff\xff" and big[65540:65545] == b"ZV\x00" + struct.pack(">H", 4465)
    # snappy chunks hold at most 32 KiB (spark.io.compression.snappy.blockSize)
    noise = os.urandom(40_000)
    framed = compress_stream("snappy", noise)
    assert len(_chunk_ends("snappy", framed)) == 3  # header, 32 KiB chunk, the rest
    assert decompress_stream("snappy", framed) == noise


@pytest.mark.parametrize("codec", ["lz4", "zstd", "snappy"])
def test_empty_file_is_corrupt(codec: str) -> None:
    with pytest.raises(CorruptFileError, match=f"{PATH}: empty file"):
        decompress_stream(codec, b"", PATH)


def test_empty_lzf_stream_is_empty() -> None:
    assert compress_stream("lzf", b"") == b""  # what LZFOutputStream writes for no data
    assert decompress_stream("lzf", b"", PATH) == b""


# Chunk boundaries of snappy and LZF streams cannot be told from the end of the file (Java reads
# such a cut short without error): the missing record end marker catches those. Any other cut
# is an error.
def _chunk_ends(codec: str, data: bytes) -> set[int]:
    ends, pos = set(), 0
    if codec == "snappy":
        pos = 16
        ends.add(pos)
        while pos < len(data):
            pos += 4 + struct.unpack_from(">i", data, pos)[0]
            ends.add(pos)
    elif codec == "lzf":
        while pos < len(data):
            (n,) = struct.unpack_from(">H", data, pos + 3)
            pos += (5 if data[pos + 2] == 0 else 7) + n
            ends.add(pos)
    return ends


@pytest.mark.parametrize("codec", CODECS)
@given(raw=st.binary(min_size=1, max_size=80_000), data=st.data())
@settings(max_examples=40, deadline=None)
def test_truncation_is_an_error(codec: str, raw: bytes, data: st.DataObject) -> None:
    stream = compress_stream(codec, raw)
    cut = data.draw(st.integers(1, len(stream) - 1))
    if cut in _chunk_ends(codec, stream):
        assert raw.startswith(decompress_stream(codec, stream[:cut]))
        return
    with pytest.raises(CorruptFileError, match=PATH):
        decompress_stream(codec, stream[:cut], PATH)


def test_zstd_frames() -> None:
    one, two = os.urandom(1000), b"x" * 5000
    frames = zstandard.ZstdCompressor().compress(one) + compress_stream("zstd", two)
    assert decompress_stream("zstd", frames) == one + two
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 3) + b"abc"
    assert decompress_stream("zstd", skippable + frames) == one + two
    with pytest.raises(CorruptFileError, match=r"zstd frame at byte \d+ does not decompress"):
        decompress_stream("zstd", frames + b"garbage!", PATH)
    with pytest.raises(
        CorruptFileError,
        match=f"truncated: zstd frame at byte {len(frames) - len(compress_stream('zstd', two))} ",
    ):
        decompress_stream("zstd", frames[:-3], PATH)


def test_snappy_details() -> None:
    one = compress_stream("snappy", b"first ")
    two = compress_stream("snappy", b"second")
    assert decompress_stream("snappy", one + two) == b"first second"  # concatenated streams
    # A stream without the magic is one raw snappy block (SnappyInputStream compatibility).
    raw_block = bytes.fromhex(JVM_VECTORS[("snappy", b"abc" * 10)])[20:]
    assert decompress_stream("snappy", raw_block) == b"abc" * 10
    with pytest.raises(CorruptFileError, match="not a snappy-java stream"):
        decompress_stream("snappy", b"LZ4Block\x15" + bytes(12), PATH)
    bad_version = SNAPPY_HEADER[:8] + struct.pack(">ii", 0, 1)
    with pytest.raises(CorruptFileError, match="incompatible version 0"):
        decompress_stream("snappy", bad_version, PATH)
    with pytest.raises(CorruptFileError, match="negative length"):
        decompress_stream("snappy", SNAPPY_HEADER + b"\xff\xff\xff\xfe", PATH)
    with pytest.raises(CorruptFileError, match="does not decompress"):
        decompress_stream("snappy", SNAPPY_HEADER + b"\x00\x00\x00\x02\x05\x00", PATH)


def test_lzf_blocks() -> None:
    # A compressed chunk with an overlapping back reference ("abc" repeated), from the JVM.
    chunk = bytes.fromhex(JVM_VECTORS[("lzf", b"abc" * 10)])
    assert lzf_decompress_block(chunk[7:], 30) == b"abc" * 10
    # literal run, long back reference (length byte), non-overlapping copy
    block = bytes([4]) + b"hello" + bytes([0xE0, 3, 4])  # copy 3+7+2 = 12 bytes from 5 back
    assert lzf_decompress_block(block, 17) == b"hello" + b"hellohellohe"
    for bad, dlen in [(b"\x05ab", 6), (bytes([0x20, 9]), 3), (b"\x00a\xe0", 5), (b"\x00a", 2)]:
        with pytest.raises(ValueError):
            lzf_decompress_block(bad, dlen)
    with pytest.raises(CorruptFileError, match="bad LZF chunk header at byte 0"):
        decompress_stream("lzf", b"ZX\x00\x00\x01a", PATH)
    with pytest.raises(CorruptFileError, match="LZF chunk at byte 0 does not decompress"):
        decompress_stream("lzf", b"ZV\x01\x00\x02\x00\x05\x00a", PATH)


# -- against the JVM ---------------------------------------------------------------------------
def _jvm_codec(spark, codec: str):  # type: ignore[no-untyped-def]
    conf = spark.sparkContext._jsc.sc().conf()
    return spark._jvm.org.apache.spark.io.CompressionCodec.createCodec(conf, codec)


def _jvm_compress(spark, codec: str, raw: bytes) -> bytes:  # type: ignore[no-untyped-def]
    bos = spark._jvm.java.io.ByteArrayOutputStream()
    out = _jvm_codec(spark, codec).compressedOutputStream(bos)
    out.write(bytearray(raw))
    out.close()
    return bytes(bos.toByteArray())


def _jvm_decompress(spark, codec: str, data: bytes) -> bytes:  # type: ignore[no-untyped-def]
    source = spark._jvm.java.io.ByteArrayInputStream(bytearray(data))
    stream = _jvm_codec(spark, codec).compressedInputStream(source)
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()


@pytest.mark.spark
@pytest.mark.parametrize(("codec", "raw"), sorted(JVM_VECTORS))
def test_jvm_vectors_are_current(spark, codec: str, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    assert _jvm_compress(spark, codec, raw).hex() == JVM_VECTORS[(codec, raw)]


@pytest.mark.spark
@pytest.mark.parametrize("codec", CODECS)
@given(st.lists(payloads, min_size=1, max_size=4))
@settings(max_examples=10, deadline=None)
def test_jvm_round_trips(spark, codec: str, batch: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    for raw in batch:
        assert decompress_stream(codec, _jvm_compress(spark, codec, raw), PATH) == raw
        assert _jvm_decompress(spark, codec, compress_stream(codec, raw)) == raw


@pytest.mark.spark
@pytest.mark.parametrize("codec", CODECS)
def test_jvm_round_trips_of_large_streams(spark, codec: str) -> None:  # type: ignore[no-untyped-def]
    raw = b"".join(os.urandom(50) + bytes(200) for _ in range(2000))  # many chunks and blocks
    assert decompress_stream(codec, _jvm_compress(spark, codec, raw)) == raw
    assert _jvm_decompress(spark, codec, compress_stream(codec, raw)) == raw
