"""lz4-java ``LZ4BlockOutputStream`` framing, which Spark's LZ4 codec wraps state files in.

Not the LZ4 frame format: each block is a 21-byte header (magic ``LZ4Block``, token, LE
compressed and decompressed lengths, XXH32 checksum masked to 28 bits) plus a raw or LZ4 block
payload; an empty block ends a stream, and streams may be concatenated.

The checks mirror ``LZ4BlockInputStream.refill`` (lz4-java 1.11.0, checked with javap), with
one deliberate difference: Java treats end-of-input at a block boundary as a clean end even
without an end mark, so a file cut between two blocks reads back short and silently. We require
the end mark, which turns that truncation into an error.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import lz4.block
import xxhash

from statectl.codecs.bytesource import Bytes, ByteSource
from statectl.errors import CorruptFileError

MAGIC = b"LZ4Block"
HEADER = struct.Struct("<8sBiii")
HEADER_SIZE = HEADER.size  # 21
METHOD_RAW = 0x10
METHOD_LZ4 = 0x20
CHECKSUM_SEED = 0x9747B28C
CHECKSUM_MASK = 0x0FFFFFFF  # StreamingXXHash32.asChecksum().getValue() keeps 28 bits
LEVEL_BASE = 10  # lz4-java COMPRESSION_LEVEL_BASE: token level = log2(block size) - 10
MIN_BLOCK_SIZE = 64
MAX_BLOCK_SIZE = 1 << (LEVEL_BASE + 0x0F)  # 32 MiB
DEFAULT_BLOCK_SIZE = 32 * 1024  # spark.io.compression.lz4.blockSize
END_MARK_SIZE = HEADER_SIZE


def checksum(raw: bytes | memoryview) -> int:
    """The block checksum lz4-java stores: XXH32(seed 0x9747B28C) masked to 28 bits."""
    return xxhash.xxh32_intdigest(raw, seed=CHECKSUM_SEED) & CHECKSUM_MASK


def block_level(block_size: int) -> int:
    """lz4-java ``compressionLevel``: ``max(0, ceil(log2(blockSize)) - 10)``."""
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"LZ4 block size must be in [64, 32 MiB], got {block_size}")
    return max(0, (block_size - 1).bit_length() - LEVEL_BASE)


def decode_lz4_block_stream(data: bytes | memoryview, path: str | None = None) -> bytes:
    """Decompress a whole stream, verifying every block's header, lengths and checksum."""
    out = list(iter_lz4_block_stream(data, path))
    if len(out) == 1 and isinstance(out[0], bytes):
        return out[0]  # one compressed block: already a fresh bytes object
    return b"".join(out)


def iter_lz4_block_stream(
    data: Bytes | Iterable[Bytes] | ByteSource, path: str | None = None
) -> Iterator[bytes | memoryview]:
    """:func:`decode_lz4_block_stream` a block at a time (a bounded read's pieces); ``data`` is
    the whole stream or its bytes in pieces (:class:`~statectl.codecs.bytesource.ByteSource`)."""
    src = ByteSource.of(data)
    ended = False
    empty = src.at_end()
    while not src.at_end():
        pos = src.pos
        token, clen, dlen, check = _read_header(src, path)
        if dlen == 0:
            ended = True  # end mark; Spark's reader keeps going if another stream follows
            continue
        yield _read_block(src, pos, token, clen, dlen, check, path)
        ended = False
    if not ended:
        raise CorruptFileError(
            "missing LZ4 end mark: the file is empty"
            if empty
            else "missing LZ4 end mark: the stream stops after a data block (file truncated?)",
            path,
        )


def _read_header(src: ByteSource, path: str | None) -> tuple[int, int, int, int]:
    """The next block header, checked: (token, compressed length, length, checksum)."""
    pos = src.pos
    have = src.available(HEADER_SIZE)
    if have < HEADER_SIZE:
        raise CorruptFileError(
            f"truncated: stream ends inside a block header at byte {pos} "
            f"({have} of {HEADER_SIZE} bytes)",
            path,
        )
    magic, token, clen, dlen, check = HEADER.unpack_from(src.take(HEADER_SIZE))
    if magic != MAGIC:
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: bad magic {bytes(magic)!r} (not an lz4-java LZ4Block "
            "stream: wrong compression codec?)",
            path,
        )
    _check_header(pos, token, clen, dlen, check, path)
    return token, clen, dlen, check


def _read_block(
    src: ByteSource, pos: int, token: int, clen: int, dlen: int, check: int, path: str | None
) -> bytes | memoryview:
    """The data of the block whose header is at ``pos``: its payload, decompressed unless
    stored raw, checked against the header's length and checksum."""
    have = src.available(clen)
    if have < clen:
        raise CorruptFileError(
            f"truncated: LZ4 block at byte {pos} needs {clen} payload bytes, only {have} remain",
            path,
        )
    payload = src.take(clen)
    raw = payload if token & 0xF0 == METHOD_RAW else _decompress(payload, pos, dlen, path)
    actual = checksum(raw)
    if actual != check:
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: checksum mismatch "
            f"(stored 0x{check & 0xFFFFFFFF:08x}, data gives 0x{actual:08x})",
            path,
        )
    return raw


def _decompress(payload: bytes | memoryview, pos: int, dlen: int, path: str | None) -> bytes:
    try:
        raw = lz4.block.decompress(payload, uncompressed_size=dlen)
    except lz4.block.LZ4BlockError as e:
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: payload does not decompress to {dlen} bytes ({e})", path
        ) from None
    if len(raw) != dlen:  # python-lz4 treats uncompressed_size as an upper bound
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: payload decompresses to {len(raw)} bytes, header says {dlen}",
            path,
        )
    return raw


def _check_header(pos: int, token: int, clen: int, dlen: int, check: int, path: str | None) -> None:
    """The header checks of ``LZ4BlockInputStream.refill``, each with its own message."""
    method = token & 0xF0
    if method not in (METHOD_RAW, METHOD_LZ4):
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: unknown compression method 0x{method:02x} in token "
            f"0x{token:02x}",
            path,
        )
    limit = 1 << (LEVEL_BASE + (token & 0x0F))
    if clen < 0 or dlen < 0 or dlen > limit:
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: invalid lengths (compressed {clen}, decompressed {dlen}, "
            f"token allows {limit})",
            path,
        )
    if (clen == 0) != (dlen == 0) or (method == METHOD_RAW and clen != dlen):
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: inconsistent lengths (compressed {clen}, "
            f"decompressed {dlen}, method 0x{method:02x})",
            path,
        )
    if dlen == 0 and check != 0:
        raise CorruptFileError(
            f"LZ4 block at byte {pos}: end mark with a nonzero checksum field", path
        )


def encode_lz4_block_stream(raw: bytes | memoryview, block_size: int = DEFAULT_BLOCK_SIZE) -> bytes:
    """What ``LZ4BlockOutputStream`` writes: full blocks of ``block_size``, each RAW when LZ4
    does not make it smaller, then the end mark. Spark reads it back (and python-lz4's default
    compressor gives the same bytes as lz4-java's fast compressor in our cross-checks)."""
    level = block_level(block_size)
    raw_token = METHOD_RAW | level
    lz4_token = METHOD_LZ4 | level
    pack = HEADER.pack
    compress = lz4.block.compress
    view = memoryview(raw).cast("B") if isinstance(raw, memoryview) else memoryview(raw)
    parts: list[bytes | memoryview] = []
    for off in range(0, len(view), block_size):
        chunk = view[off : off + block_size]
        size = len(chunk)
        comp = compress(chunk, store_size=False)
        if len(comp) >= size:  # lz4-java: compressedLength >= o -> store RAW
            parts.append(pack(MAGIC, raw_token, size, size, checksum(chunk)))
            parts.append(chunk)
        else:
            parts.append(pack(MAGIC, lz4_token, len(comp), size, checksum(chunk)))
            parts.append(comp)
    parts.append(pack(MAGIC, raw_token, 0, 0, 0))
    return b"".join(parts)
