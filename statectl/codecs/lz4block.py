"""lz4-java ``LZ4BlockOutputStream`` framing, which Spark's LZ4 codec wraps state files in.

Not the LZ4 frame format: each block is a 21-byte header (magic ``LZ4Block``, token, LE
compressed and decompressed lengths, XXH32 checksum masked to 28 bits) plus a raw or LZ4 block
payload; an empty block ends a stream, and streams may be concatenated.
"""

from __future__ import annotations

import struct

import lz4.block
import xxhash

from statectl.errors import CorruptFileError

MAGIC = b"LZ4Block"
HEADER = struct.Struct("<8sBiii")
HEADER_SIZE = HEADER.size  # 21
METHOD_RAW = 0x10
METHOD_LZ4 = 0x20
CHECKSUM_SEED = 0x9747B28C
DEFAULT_BLOCK_SIZE = 32 * 1024


def checksum(raw: bytes | memoryview) -> int:
    return xxhash.xxh32_intdigest(raw, seed=CHECKSUM_SEED) & 0x0FFFFFFF


def _level(block_size: int) -> int:
    # lz4-java: compressionLevel = max(0, ceil(log2(blockSize)) - 10)
    return max(0, (block_size - 1).bit_length() - 10)


def decode_lz4_block_stream(data: bytes | memoryview, path: str | None = None) -> bytes:
    """Decompress a whole stream, verifying every block's lengths and checksum."""
    view = memoryview(data)
    out: list[bytes] = []
    pos = 0
    ended = False
    n = len(view)
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise CorruptFileError(
                f"truncated: stream ends inside an LZ4 block header at byte {pos}", path
            )
        magic, token, clen, dlen, check = HEADER.unpack_from(view, pos)
        if magic != MAGIC:
            raise CorruptFileError(
                f"bad LZ4 block magic at byte {pos} (not an LZ4 state file?)", path
            )
        method = token & 0xF0
        if (
            clen < 0
            or dlen < 0
            or (method == METHOD_RAW and clen != dlen)
            or method not in (METHOD_RAW, METHOD_LZ4)
        ):
            raise CorruptFileError(f"invalid LZ4 block header at byte {pos}", path)
        start = pos + HEADER_SIZE
        if start + clen > n:
            raise CorruptFileError(
                f"truncated: LZ4 block at byte {pos} needs {clen} bytes, {n - start} left", path
            )
        if dlen == 0:
            ended = True  # end mark; Spark's reader keeps reading if more streams follow
            pos = start + clen
            continue
        ended = False
        payload = view[start : start + clen]
        if method == METHOD_RAW:
            raw = bytes(payload)
        else:
            try:
                raw = lz4.block.decompress(payload, uncompressed_size=dlen)
            except lz4.block.LZ4BlockError:
                raise CorruptFileError(
                    f"LZ4 block at byte {pos} does not decompress", path
                ) from None
            if len(raw) != dlen:
                raise CorruptFileError(f"LZ4 block at byte {pos}: wrong decompressed length", path)
        if checksum(raw) != (check & 0x0FFFFFFF) or check < 0:
            raise CorruptFileError(
                f"LZ4 block at byte {pos}: checksum mismatch (file corrupt)", path
            )
        out.append(raw)
        pos = start + clen
    if not ended:
        raise CorruptFileError("truncated: missing LZ4 end mark", path)
    return b"".join(out)


def encode_lz4_block_stream(raw: bytes, block_size: int = DEFAULT_BLOCK_SIZE) -> bytes:
    """What lz4-java writes: blocks of ``block_size`` (RAW when LZ4 does not shrink them), end mark."""
    level = _level(block_size)
    parts: list[bytes] = []
    view = memoryview(raw)
    for off in range(0, len(raw), block_size):
        chunk = bytes(view[off : off + block_size])
        comp = lz4.block.compress(chunk, store_size=False)
        if len(comp) >= len(chunk):
            parts.append(
                HEADER.pack(MAGIC, METHOD_RAW | level, len(chunk), len(chunk), checksum(chunk))
            )
            parts.append(chunk)
        else:
            parts.append(
                HEADER.pack(MAGIC, METHOD_LZ4 | level, len(comp), len(chunk), checksum(chunk))
            )
            parts.append(comp)
    parts.append(HEADER.pack(MAGIC, METHOD_RAW | level, 0, 0, 0))
    return b"".join(parts)
