"""Java ``DataInputStream``/``DataOutputStream`` primitives used by Spark's binary metadata files."""

from __future__ import annotations

import struct

from statectl.errors import CorruptFileError


def decode_modified_utf8(data: bytes) -> str:
    """Java's modified UTF-8: NUL as C0 80, supplementary characters as CESU-8 surrogate pairs."""
    text = data.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    # Re-pair surrogates that CESU-8 encoded separately.
    return text.encode("utf-16", "surrogatepass").decode("utf-16")


def encode_modified_utf8(text: str) -> bytes:
    out = text.encode("utf-16-le", "surrogatepass")
    units = struct.unpack(f"<{len(out) // 2}H", out)
    parts = []
    for u in units:
        if u == 0:
            parts.append(b"\xc0\x80")
        else:
            parts.append(chr(u).encode("utf-8", "surrogatepass"))
    return b"".join(parts)


class DataReader:
    """A cursor over bytes with the big-endian reads of ``java.io.DataInputStream``."""

    def __init__(self, data: bytes, path: str | None = None) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise CorruptFileError(
                f"truncated: needs {n} bytes at offset {self.pos}, file has {len(self.data)}",
                self.path,
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def read_int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def read_short(self) -> int:
        return struct.unpack(">h", self._take(2))[0]

    def read_utf(self) -> str:
        (n,) = struct.unpack(">H", self._take(2))
        start = self.pos
        try:
            return decode_modified_utf8(self._take(n))
        except UnicodeDecodeError:
            raise CorruptFileError(
                f"string at offset {start} is not (modified) UTF-8", self.path
            ) from None

    def at_end(self) -> bool:
        return self.pos >= len(self.data)


class DataWriter:
    """The big-endian writes of ``java.io.DataOutputStream``."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write_int(self, v: int) -> None:
        self.parts.append(struct.pack(">i", v))

    def write_short(self, v: int) -> None:
        self.parts.append(struct.pack(">h", v))

    def write_utf(self, s: str) -> None:
        data = encode_modified_utf8(s)
        if len(data) > 65535:
            raise ValueError("writeUTF string longer than 65535 bytes")
        self.parts.append(struct.pack(">H", len(data)) + data)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)
