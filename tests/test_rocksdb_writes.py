"""The streamed writers of RocksDB changelogs and HDFS snapshots (statectl/backends/streamed.py):
a stream written in writes of any size, smaller and larger than a codec block, is the same
bytes as the one-shot framing, and the record streams are what ``write_state_records`` writes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statectl.backends.streamed import CodecStream
from statectl.codecs.compression import compress_stream, decompress_stream
from statectl.codecs.records import record_stream, write_state_records


@pytest.mark.parametrize("codec", ["lz4", "zstd", "snappy", "lzf"])
def test_writes_of_any_size_frame_as_one_shot(tmp_path, codec):
    """Writes that leave a block half full, then fill it and pass whole blocks straight on
    (the path without a copy), then a byte at a time."""
    raw = np.random.default_rng(2).integers(0, 4, 700_000, dtype=np.uint8).tobytes()
    sizes = [7_777, 200_000, 1, 65_536, 131_072, 3, 250_000]
    with open(tmp_path / "out", "wb") as f:
        stream = CodecStream(codec, f, len(raw))
        at = 0
        for size in sizes * 3:
            piece = raw[at : at + size]
            stream.write(memoryview(piece) if size % 2 else piece)
            at += size
        stream.write(raw[at:])
        stream.close()
    data = (tmp_path / "out").read_bytes()
    assert decompress_stream(codec, data) == raw
    assert data == compress_stream(codec, raw)


def test_record_stream_is_write_state_records_without_the_end_marker():
    keys = pa.array([b"a", b"bb", b""], pa.large_binary())
    values = pa.array([b"1", None, b"333"], pa.large_binary())
    whole = write_state_records(keys, values, prefix=b"\x00")
    assert record_stream(keys, values, prefix=b"\x00").to_pybytes() == whole[:-4]
    assert record_stream(keys, values, prefix=b"\x00", end=True).to_pybytes() == whole
    assert whole[-4:] == b"\xff\xff\xff\xff"
    empty = pa.array([], pa.large_binary())
    assert record_stream(empty, empty).to_pybytes() == b""
