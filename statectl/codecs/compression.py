"""The codec streams Spark wraps ``.delta``, ``.snapshot`` and ``.changelog`` files in.

Chosen by the pinned ``spark.sql.streaming.stateStore.compression.codec`` and created with
``CompressionCodec.createCodec``; each framing below was checked against the 4.3.0 jars (javap)
and by round trips through the JVM codecs (tests marked ``spark``):

* lz4: lz4-java ``LZ4BlockOutputStream`` blocks (:mod:`statectl.codecs.lz4block`).
* zstd: zstd-jni ``ZstdOutputStreamNoFinalizer``: ordinary zstd frames without content size or
  checksum; a stream may hold several frames.
* snappy: snappy-java ``SnappyOutputStream``: a 16-byte header (magic ``82 'SNAPPY' 00``, int32 BE
  version 1, int32 BE compatible version 1), then ``int32 BE length + raw snappy block`` chunks.
  Not the snappy framing format.
* lzf: Ning compress-lzf ``LZFOutputStream``: chunks ``'Z' 'V' type``; type 0 = stored with a
  uint16 BE length, otherwise compressed with uint16 BE compressed and uncompressed lengths.

Readers are strict where Java is lenient about truncation (a stream cut at a chunk boundary reads
back short in Java): every codec stream must be complete, and an empty lz4/zstd/snappy file is
an error, as those writers always write something. An empty LZF stream is what LZF writes for no
data; the record layer then reports the missing end marker of the state file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import cramjam
import zstandard

from statectl.codecs.bytesource import Bytes, ByteSource
from statectl.codecs.lz4block import (
    decode_lz4_block_stream,
    encode_lz4_block_stream,
    iter_lz4_block_stream,
)
from statectl.errors import CorruptFileError, UnsupportedError

CODECS = ("lz4", "zstd", "snappy", "lzf")
# CompressionCodec.shortCompressionCodecNames: short names are matched case-insensitively,
# class names exactly (Spark passes them to Class.forName).
CLASS_NAMES = {
    "org.apache.spark.io.LZ4CompressionCodec": "lz4",
    "org.apache.spark.io.ZStdCompressionCodec": "zstd",
    "org.apache.spark.io.SnappyCompressionCodec": "snappy",
    "org.apache.spark.io.LZFCompressionCodec": "lzf",
}
SNAPPY_MAGIC = b"\x82SNAPPY\x00"
SNAPPY_HEADER = SNAPPY_MAGIC + struct.pack(">ii", 1, 1)  # SnappyCodec.currentHeader
SNAPPY_BLOCK_SIZE = 32 * 1024  # spark.io.compression.snappy.blockSize
ZSTD_LEVEL = 1  # spark.io.compression.zstd.level
# A state file's decompressed size is taken to be at most this many times its own when a
# bounded read decides whether to decompress it whole (keys repeat: ratios of 5+ are common).
EXPANSION = 8
LZF_MAX_CHUNK = 0xFFFF  # LZFChunk.MAX_CHUNK_LEN
_BE_INT = struct.Struct(">i")
_BE_U16 = struct.Struct(">H")


def normalize_codec(name: str) -> str:
    """Spark's codec name or class name -> one of :data:`CODECS`."""
    key = name.strip()
    if key.lower() in CODECS:
        return key.lower()
    if key in CLASS_NAMES:
        return CLASS_NAMES[key]
    raise UnsupportedError(
        f"unsupported state store compression codec {name!r} "
        f"(supported: {', '.join(CODECS)} or their org.apache.spark.io class names)"
    )


def decompress_stream(codec: str, data: bytes | memoryview, path: str | None = None) -> bytes:
    """The raw bytes of one state file written through Spark's ``codec``."""
    codec = normalize_codec(codec)
    if len(data) == 0 and codec != "lzf":  # LZFOutputStream writes nothing for no data
        raise CorruptFileError(f"empty file (a {codec} stream is never empty)", path)
    if codec == "lz4":
        return decode_lz4_block_stream(data, path)
    if codec == "zstd":
        return _zstd_decompress(data, path)
    if codec == "snappy":
        return _snappy_decompress(data, path)
    return _lzf_decompress(data, path)


def iter_decompressed(
    codec: str, data: Bytes | Iterable[Bytes], path: str | None = None
) -> Iterator[bytes | memoryview]:
    """:func:`decompress_stream` in pieces (codec blocks or frames' output), for reads that
    must not hold a file's decompressed bytes at once; the same checks, raised as reached.
    ``data`` may itself come in pieces (a large file read a block at a time), so that its
    compressed bytes are not held at once either."""
    codec = normalize_codec(codec)
    src = ByteSource.of(data)
    if src.at_end() and codec != "lzf":
        raise CorruptFileError(f"empty file (a {codec} stream is never empty)", path)
    if codec == "lz4":
        yield from iter_lz4_block_stream(src, path)
    elif codec == "zstd":
        yield from _zstd_pieces(src, path)
    elif codec == "snappy":
        yield from _snappy_pieces(src, path)
    else:
        yield from _lzf_pieces(src, path)


def compress_stream(codec: str, raw: bytes | memoryview) -> bytes:
    """``raw`` framed as Spark's ``codec`` writes it; Spark's reader accepts every one."""
    codec = normalize_codec(codec)
    if codec == "lz4":
        return encode_lz4_block_stream(raw)
    if codec == "zstd":
        # zstd-jni writes no content size; keeping it is harmless and lets tools size buffers.
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)
    if codec == "snappy":
        return _snappy_compress(raw)
    return _lzf_compress(raw)


# -- zstd ------------------------------------------------------------------------------------
def _zstd_pieces(data: Bytes | Iterable[Bytes] | ByteSource, path: str | None) -> Iterator[bytes]:
    """Frame by frame, fed 1 MiB of input at a time (output bounded by the input's ratio)."""
    src = ByteSource.of(data)
    step = 1 << 20
    while not src.at_end():
        offset = src.pos
        dobj = zstandard.ZstdDecompressor().decompressobj()
        unused = b""
        try:
            while not dobj.eof and not src.at_end():
                piece = dobj.decompress(src.take(step))
                if piece:
                    yield piece
            unused = dobj.unused_data if dobj.eof else b""
        except zstandard.ZstdError as e:
            raise CorruptFileError(
                f"zstd frame at byte {offset} does not decompress ({e})", path
            ) from None
        if not dobj.eof:
            raise CorruptFileError(
                f"truncated: zstd frame at byte {offset} ends before its last block", path
            )
        src.unread(len(unused))  # the next frame's first bytes


def _zstd_decompress(data: bytes | memoryview, path: str | None) -> bytes:
    out: list[bytes] = []
    rest = bytes(data)
    offset = 0
    while rest:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        try:
            out.append(dobj.decompress(rest))
        except zstandard.ZstdError as e:
            raise CorruptFileError(
                f"zstd frame at byte {offset} does not decompress ({e})", path
            ) from None
        if not dobj.eof:
            raise CorruptFileError(
                f"truncated: zstd frame at byte {offset} ends before its last block", path
            )
        offset += len(rest) - len(dobj.unused_data)
        rest = dobj.unused_data
    return out[0] if len(out) == 1 else b"".join(out)


# -- snappy ----------------------------------------------------------------------------------
def _snappy_decompress(data: bytes | memoryview, path: str | None) -> bytes:
    return b"".join(_snappy_pieces(data, path))


def _snappy_pieces(data: Bytes | Iterable[Bytes] | ByteSource, path: str | None) -> Iterator[bytes]:
    src = ByteSource.of(data)
    if src.available(len(SNAPPY_HEADER)) < len(SNAPPY_HEADER) or bytes(src.peek(8)) != SNAPPY_MAGIC:
        # SnappyInputStream reads a stream without the magic as one raw block (data written by
        # Snappy.compress); Spark itself always writes the header.
        yield _raw_snappy_block(src, path)
        return
    while not src.at_end():
        pos = src.pos
        if src.available(4) < 4:
            raise CorruptFileError(
                f"truncated: stream ends inside a snappy chunk length at byte {pos}", path
            )
        if bytes(src.peek(8)) == SNAPPY_MAGIC:  # a header: first one, or concatenated
            _skip_snappy_header(src, path)
        else:
            yield _snappy_chunk(src, path)


def _raw_snappy_block(src: ByteSource, path: str | None) -> bytes:
    try:
        return bytes(cramjam.snappy.decompress_raw(src.rest()))
    except cramjam.DecompressionError:
        raise CorruptFileError(
            "not a snappy-java stream: no 82 'SNAPPY' 00 header, and not a raw snappy block",
            path,
        ) from None


def _skip_snappy_header(src: ByteSource, path: str | None) -> None:
    """A snappy-java header (magic and version), checked."""
    pos = src.pos
    if src.available(len(SNAPPY_HEADER)) < len(SNAPPY_HEADER):
        raise CorruptFileError(f"truncated snappy-java header at byte {pos}", path)
    (version,) = _BE_INT.unpack_from(src.take(len(SNAPPY_HEADER)), 8)
    if version < 1:  # SnappyInputStream.isValidHeader
        raise CorruptFileError(
            f"snappy-java header at byte {pos}: incompatible version {version}", path
        )


def _snappy_chunk(src: ByteSource, path: str | None) -> bytes:
    """A length-prefixed snappy chunk, decompressed."""
    pos = src.pos
    (size,) = _BE_INT.unpack_from(src.take(4))
    if size < 0:
        raise CorruptFileError(f"snappy chunk at byte {pos}: negative length {size}", path)
    have = src.available(size)
    if have < size:
        raise CorruptFileError(
            f"truncated: snappy chunk at byte {pos} needs {size} bytes, only {have} remain",
            path,
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(src.take(size)))
    except cramjam.DecompressionError as e:
        raise CorruptFileError(
            f"snappy chunk at byte {pos} does not decompress ({e})", path
        ) from None


def _snappy_compress(raw: bytes | memoryview, block: int = SNAPPY_BLOCK_SIZE) -> bytes:
    view = memoryview(raw)
    parts: list[bytes] = [SNAPPY_HEADER]
    for off in range(0, len(view), block):
        comp = bytes(cramjam.snappy.compress_raw(view[off : off + block]))
        parts.append(_BE_INT.pack(len(comp)))
        parts.append(comp)
    return b"".join(parts)


# -- lzf -------------------------------------------------------------------------------------
def _lzf_decompress(data: bytes | memoryview, path: str | None) -> bytes:
    return b"".join(_lzf_pieces(data, path))


def _lzf_pieces(data: Bytes | Iterable[Bytes] | ByteSource, path: str | None) -> Iterator[bytes]:
    src = ByteSource.of(data)
    while not src.at_end():
        pos = src.pos
        # ChunkDecoder.decodeChunk: 'Z' 'V' type, then uint16 lengths; type 0 = stored and
        # any other type = compressed (Java does not check the value further).
        head = bytes(src.peek(7))
        if len(head) < 5 or head[:2] != b"ZV":
            raise CorruptFileError(
                f"bad LZF chunk header at byte {pos} (expected 'ZV', type, length)", path
            )
        kind = head[2]
        (clen,) = _BE_U16.unpack_from(head, 3)
        if kind == 0:
            src.take(5)
            if src.available(clen) < clen:
                raise CorruptFileError(f"truncated: stored LZF chunk at byte {pos}", path)
            yield bytes(src.take(clen))
            continue
        if len(head) < 7:
            raise CorruptFileError(f"truncated: LZF chunk header at byte {pos}", path)
        (dlen,) = _BE_U16.unpack_from(head, 5)
        src.take(7)
        if src.available(clen) < clen:
            raise CorruptFileError(f"truncated: compressed LZF chunk at byte {pos}", path)
        try:
            piece = lzf_decompress_block(bytes(src.take(clen)), dlen)
        except ValueError as e:
            raise CorruptFileError(
                f"LZF chunk at byte {pos} does not decompress ({e})", path
            ) from None
        yield piece


def lzf_decompress_block(src: bytes, dlen: int) -> bytes:
    """One liblzf block. A loop over LZF tokens (LZF state files are rare); copies whole literal
    runs and back references by slicing, and byte patterns for overlapping references."""
    out = bytearray()
    i = 0
    n = len(src)
    while i < n:
        ctrl = src[i]
        i += 1
        if ctrl < 32:  # literal run of ctrl + 1 bytes
            end = i + ctrl + 1
            if end > n:
                raise ValueError("literal run past the end of the chunk")
            out += src[i:end]
            i = end
            continue
        length = ctrl >> 5
        if length == 7:
            if i >= n:
                raise ValueError("back reference past the end of the chunk")
            length += src[i]
            i += 1
        if i >= n:
            raise ValueError("back reference past the end of the chunk")
        dist = ((ctrl & 0x1F) << 8) + src[i] + 1
        i += 1
        length += 2
        ref = len(out) - dist
        if ref < 0:
            raise ValueError("back reference before the start of the output")
        if dist >= length:
            out += out[ref : ref + length]
        else:  # overlapping: the last ``dist`` bytes repeat
            pattern = out[ref:]
            out += (pattern * (length // dist + 1))[:length]
    if len(out) != dlen:
        raise ValueError(f"decompresses to {len(out)} bytes, header says {dlen}")
    return bytes(out)


def _lzf_compress(raw: bytes | memoryview) -> bytes:
    """Stored LZF chunks: a valid ``LZFInputStream`` stream (Java also stores chunks that do
    not compress), without a pure-Python LZF compressor for a codec that is rarely used."""
    view = memoryview(raw)
    parts: list[bytes | memoryview] = []
    for off in range(0, len(view), LZF_MAX_CHUNK):
        chunk = view[off : off + LZF_MAX_CHUNK]
        parts.append(b"ZV\x00" + _BE_U16.pack(len(chunk)))
        parts.append(chunk)
    return b"".join(parts)
