"""Bounded capture of a command's output, up to the shell's sentinel line.

Output streams in chunks from the pty; a chunk boundary may split the sentinel, and a
command may print gigabytes. :class:`Capture` keeps the first and last halves of ``limit``
bytes (dropping the middle, counted), and searches for the sentinel in a window that spans
the previous chunk's last :data:`KEEP` bytes and the new chunk.
"""

from __future__ import annotations

import asyncio
import re

KEEP = 256  # bytes kept around chunk boundaries for the sentinel search


class Capture:
    """One command's output, bounded while it streams, up to the sentinel."""

    def __init__(self, limit: int, sentinel: re.Pattern[bytes]) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.sentinel = sentinel
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0  # bytes fed so far
        self.end: int | None = None  # offset of the sentinel in the stream
        self.exit_code: int | None = None
        self.leftover = b""  # bytes after the sentinel (a background job's output)
        self.done = False
        self.waiter: asyncio.Future | None = None  # resolved when done, if set

    def feed(self, data: bytes) -> None:
        if self.done:
            self.leftover += data
            return
        window_start = self.total - min(KEEP, len(self.tail) + len(self.head))
        window = self._stream_slice(window_start) + data
        self._append(data)
        match = self.sentinel.search(window)
        if match:
            self.end = window_start + match.start()
            self.exit_code = int(match.group(1))
            self.leftover = bytes(window[match.end() :])
            self.finish()

    def finish(self) -> None:
        """Mark the end (the sentinel came, or the shell died or was killed)."""
        self.done = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout_s: float) -> bool:
        """Wait until done; False on timeout (the capture may be waited on again)."""
        if self.done:
            return True
        loop = asyncio.get_running_loop()
        if self.waiter is None or self.waiter.done():
            self.waiter = loop.create_future()
        # a timer, not asyncio.wait or wait_for: their bookkeeping was a tenth of a bash call
        timer = loop.call_later(timeout_s, _expire, self.waiter)
        try:
            await self.waiter
        except TimeoutError:
            pass
        finally:
            timer.cancel()
        return self.done

    def _append(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        excess = len(self.tail) - (self.tail_limit + KEEP)
        if excess > 0:
            del self.tail[:excess]

    def _stream_slice(self, start: int) -> bytes:
        """Stream bytes from offset ``start`` to the end (start must be within the last KEEP)."""
        tail_start = self.total - len(self.tail)
        if start >= tail_start:
            return bytes(self.tail[start - tail_start :])
        return bytes(self.head[start:]) + bytes(self.tail)

    def output(self) -> tuple[str, bool]:
        """The output before the sentinel (or all of it), and whether some was dropped."""
        end = self.total if self.end is None else self.end
        if end <= len(self.head):
            return self.head[:end].decode(errors="replace"), False
        tail_start = self.total - len(self.tail)
        if tail_start <= len(self.head):
            body = self.head + self.tail[len(self.head) - tail_start : end - tail_start]
            return body.decode(errors="replace"), False
        kept = self.tail[: end - tail_start][-self.tail_limit :]
        dropped = end - len(self.head) - len(kept)
        limit = self.head_limit + self.tail_limit
        note = f"\n[... {dropped} bytes of output dropped (limit {limit} bytes) ...]\n"
        return self.head.decode(errors="replace") + note + kept.decode(errors="replace"), True


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
