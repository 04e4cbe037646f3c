"""The codec streams Spark wraps ``.delta``, ``.snapshot`` and ``.changelog`` files in.

Chosen by the pinned ``spark.sql.streaming.stateStore.compression.codec``: lz4 (lz4-java block
framing), zstd (zstd-jni stream, possibly several frames), snappy (snappy-java
``SnappyOutputStream`` framing) and lzf (Ning compress-lzf chunks).
"""

from __future__ import annotations

import struct

import cramjam
import zstandard

from statectl.codecs.lz4block import decode_lz4_block_stream, encode_lz4_block_stream
from statectl.errors import CorruptFileError, UnsupportedError

CODECS = ("lz4", "zstd", "snappy", "lzf")
_CLASS_NAMES = {
    "org.apache.spark.io.lz4compressioncodec": "lz4",
    "org.apache.spark.io.zstdcompressioncodec": "zstd",
    "org.apache.spark.io.snappycompressioncodec": "snappy",
    "org.apache.spark.io.lzfcompressioncodec": "lzf",
}
SNAPPY_MAGIC = b"\x82SNAPPY\x00"


def normalize_codec(name: str) -> str:
    key = name.strip().lower()
    if key in CODECS:
        return key
    if key in _CLASS_NAMES:
        return _CLASS_NAMES[key]
    raise UnsupportedError(
        f"unsupported state store compression codec {name!r} (supported: {', '.join(CODECS)})"
    )


def _zstd_decompress(data: bytes, path: str | None) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        out = reader.read()
        while True:
            more = reader.read()
            if not more:
                break
            out += more
        return out
    except zstandard.ZstdError as e:
        raise CorruptFileError(f"zstd stream does not decompress ({e})", path) from None


def _snappy_decompress(data: bytes, path: str | None) -> bytes:
    if not data.startswith(SNAPPY_MAGIC) or len(data) < 16:
        raise CorruptFileError("not a snappy-java stream (bad header)", path)
    pos, out = 16, []
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptFileError(f"truncated snappy chunk header at byte {pos}", path)
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise CorruptFileError(f"truncated snappy chunk at byte {pos}", path)
        try:
            out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + n])))
        except Exception:
            raise CorruptFileError(
                f"snappy chunk at byte {pos} does not decompress", path
            ) from None
        pos += n
    return b"".join(out)


def _snappy_compress(raw: bytes, block: int = 32 * 1024) -> bytes:
    parts = [SNAPPY_MAGIC, struct.pack(">ii", 1, 1)]
    for off in range(0, len(raw), block):
        comp = bytes(cramjam.snappy.compress_raw(raw[off : off + block]))
        parts.append(struct.pack(">i", len(comp)) + comp)
    return b"".join(parts)


def _lzf_decompress(data: bytes, path: str | None) -> bytes:
    pos, out = 0, []
    while pos < len(data):
        if data[pos : pos + 2] != b"ZV" or pos + 5 > len(data):
            raise CorruptFileError(f"bad LZF chunk header at byte {pos}", path)
        kind = data[pos + 2]
        (clen,) = struct.unpack_from(">H", data, pos + 3)
        if kind == 0:
            out.append(data[pos + 5 : pos + 5 + clen])
            pos += 5 + clen
        elif kind == 1:
            (dlen,) = struct.unpack_from(">H", data, pos + 5)
            chunk = data[pos + 7 : pos + 7 + clen]
            try:
                out.append(
                    bytes(cramjam.lzf.decompress(chunk, output_len=dlen))
                    if hasattr(cramjam, "lzf")
                    else _lzf_raw(chunk, dlen)
                )
            except Exception:
                raise CorruptFileError(
                    f"LZF chunk at byte {pos} does not decompress", path
                ) from None
            pos += 7 + clen
        else:
            raise CorruptFileError(f"unknown LZF chunk type {kind} at byte {pos}", path)
    return b"".join(out)


def _lzf_raw(src: bytes, dlen: int) -> bytes:
    """Plain LZF decompression (liblzf format); only used for the rare lzf codec."""
    out = bytearray()
    i = 0
    while i < len(src):
        ctrl = src[i]
        i += 1
        if ctrl < 32:
            out += src[i : i + ctrl + 1]
            i += ctrl + 1
        else:
            length = ctrl >> 5
            ref = len(out) - ((ctrl & 0x1F) << 8) - 1
            if length == 7:
                length += src[i]
                i += 1
            ref -= src[i]
            i += 1
            for _ in range(length + 2):
                out.append(out[ref])
                ref += 1
    if len(out) != dlen:
        raise ValueError("LZF length mismatch")
    return bytes(out)


def decompress_stream(codec: str, data: bytes, path: str | None = None) -> bytes:
    codec = normalize_codec(codec)
    if codec == "lz4":
        return decode_lz4_block_stream(data, path)
    if codec == "zstd":
        return _zstd_decompress(data, path)
    if codec == "snappy":
        return _snappy_decompress(data, path)
    return _lzf_decompress(data, path)


def compress_stream(codec: str, raw: bytes) -> bytes:
    codec = normalize_codec(codec)
    if codec == "lz4":
        return encode_lz4_block_stream(raw)
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(raw)
    if codec == "snappy":
        return _snappy_compress(raw)
    # LZF: stored (uncompressed) chunks are valid LZF streams.
    parts = []
    for off in range(0, len(raw), 0xFFFF):
        chunk = raw[off : off + 0xFFFF]
        parts.append(b"ZV\x00" + struct.pack(">H", len(chunk)) + chunk)
    return b"".join(parts)
