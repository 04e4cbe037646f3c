"""Sequential reads over a file's bytes, given whole or as a stream of blocks.

The codec readers walk a stream frame by frame. Given the whole file they slice it without
copying; given blocks (a large file read from storage a few MiB at a time, its checksum
verified as it goes) they hold only the frame being decoded, so a file's compressed bytes
never have to be in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

Bytes = bytes | bytearray | memoryview


class ByteSource:
    """A cursor over ``data``: one buffer, or an iterable of buffers read in order."""

    def __init__(self, data: Bytes | Iterable[Bytes]) -> None:
        if isinstance(data, bytes | bytearray | memoryview):
            self._blocks: Iterator[Bytes] = iter((data,))
        else:
            self._blocks = iter(data)
        self._buf = memoryview(b"")
        self._at = 0  # the next unread byte of _buf
        self.pos = 0  # the next unread byte of the whole stream
        self._done = False

    def available(self, n: int) -> int:
        """Buffer up to ``n`` unread bytes; how many there are (fewer only at the end)."""
        have = len(self._buf) - self._at
        if have >= n or self._done:
            return min(have, n)
        parts = [self._buf[self._at :]] if have else []
        while have < n:
            block = next(self._blocks, None)
            if block is None:
                self._done = True
                break
            view = memoryview(block).cast("B")
            if len(view):
                parts.append(view)
                have += len(view)
        self._buf = parts[0] if len(parts) == 1 else memoryview(b"".join(parts))
        self._at = 0
        return min(have, n)

    @classmethod
    def of(cls, data: Bytes | Iterable[Bytes] | ByteSource) -> ByteSource:
        """``data`` as a source (a source already is one: a reader may look ahead, then hand
        the same cursor on)."""
        return data if isinstance(data, ByteSource) else cls(data)

    def peek(self, n: int) -> memoryview:
        """The next ``n`` bytes (fewer at the end), not consumed."""
        k = self.available(n)
        return self._buf[self._at : self._at + k]

    def take(self, n: int) -> memoryview:
        """The next ``n`` bytes (fewer at the end), consumed."""
        out = self.peek(n)
        self._at += len(out)
        self.pos += len(out)
        return out

    def unread(self, n: int) -> None:
        """Give back the last ``n`` bytes taken (a zstd frame's unused tail): they are still in
        the buffer, as nothing was read since."""
        if n > self._at:
            raise ValueError("cannot unread past the buffer")
        self._at -= n
        self.pos -= n

    def at_end(self) -> bool:
        return self.available(1) == 0

    def rest(self) -> memoryview:
        """Everything left, consumed (for formats read only as a whole)."""
        chunks = []
        while not self.at_end():
            chunks.append(bytes(self.take(len(self._buf) - self._at)))
        return memoryview(b"".join(chunks))
