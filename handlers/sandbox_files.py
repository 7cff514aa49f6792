"""Moving files of any size and content in and out of a sandbox through its tool server.

Handlers use these to take artifacts out of the agent's sandbox (a solution, a patch) and to put
inputs into a fresh EVAL sandbox. Text goes in through the editor's ``create`` (one call, any
size a protocol frame holds). Bytes go through bash: the tool server keeps at most 32 KiB of a
command's output and decodes it as text, so files are moved as base64 in pages well under that
cap, byte-exact whatever they hold (non-UTF-8 bytes, carriage returns, no final newline).
"""
from __future__ import annotations

import base64
import shlex
from typing import Any

#: base64 characters per bash call (the tool server keeps 32 KiB of output)
PAGE_CHARS = 24_000
DEFAULT_LIMIT_BYTES = 8 * 2**20


class SandboxCommandError(RuntimeError):
    """A helper command failed in the sandbox (its output is in the message)."""


class SandboxFileTooLarge(ValueError):
    """A file in the sandbox is larger than the reader's limit."""


async def sh(sandbox: Any, command: str, timeout_s: float = 60.0, *, check: bool = True) -> str:
    """Run ``command``; its output, or SandboxCommandError when it fails (and ``check``)."""
    result = await sandbox.bash(command, timeout_s=timeout_s)
    if check and (result.timed_out or result.exit_code != 0):
        what = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        raise SandboxCommandError(f"{command.splitlines()[0][:200]!r} failed ({what}): {result.output.strip()[-2000:]}")
    return result.output


async def read_bytes(sandbox: Any, path: str, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> bytes | None:
    """The content of ``path`` in the sandbox, None when it does not exist.

    SandboxFileTooLarge when it is larger than ``limit_bytes``.
    """
    quoted = shlex.quote(path)
    output = await sh(sandbox, f"if [ -f {quoted} ]; then stat -c %s {quoted}; else echo none; fi")
    size = output.strip().splitlines()[-1] if output.strip() else "none"
    if size == "none":
        return None
    if int(size) > limit_bytes:
        raise SandboxFileTooLarge(f"{path} is {int(size)} bytes, more than the limit of {limit_bytes}")
    encoded_size = 4 * ((int(size) + 2) // 3)
    pages = []
    for start in range(0, encoded_size, PAGE_CHARS):
        page = await sh(sandbox, f"base64 -w0 {quoted} | cut -c {start + 1}-{start + PAGE_CHARS}")
        pages.append("".join(page.split()))
    return base64.b64decode("".join(pages))


async def write_text(sandbox: Any, path: str, text: str) -> None:
    """Write ``text`` to ``path`` (inside the workspace) in one editor call, replacing any file."""
    await sandbox.editor("create", path, file_text=text, overwrite=True)


async def write_bytes(sandbox: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` in the sandbox (its directory is created)."""
    quoted, staged = shlex.quote(path), shlex.quote(path + ".b64")
    await sh(sandbox, f"mkdir -p \"$(dirname {quoted})\" && : > {staged}")
    encoded = base64.b64encode(data).decode("ascii")
    for start in range(0, len(encoded), PAGE_CHARS):
        await sh(sandbox, f"printf %s {encoded[start:start + PAGE_CHARS]} >> {staged}")
    await sh(sandbox, f"base64 -d {staged} > {quoted} && rm -f {staged}")
