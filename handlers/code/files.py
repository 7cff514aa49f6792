"""Moving files in and out of a sandbox through its tool server.

Writing goes through the editor's ``create`` (any size a protocol frame holds). Reading goes
through bash in base64 chunks: a tool call's output is capped (32 KiB by default) and passes a
pty, so raw text could be cut or mangled; base64 is plain ASCII of a known length.
"""
from __future__ import annotations

import base64
import shlex
from typing import Any

#: bytes per read call: their base64 (4/3 larger) stays under the tool server's 32 KiB output cap
CHUNK_BYTES = 18_000
_READ = ("import base64,os,sys\n"
         "p,o,n=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])\n"
         "if not os.path.isfile(p): print('MISSING'); sys.exit()\n"
         "f=open(p,'rb'); f.seek(o); print(os.path.getsize(p), base64.b64encode(f.read(n)).decode())")


class SandboxFileError(RuntimeError):
    """A file could not be read from the sandbox (the reply was not what the reader prints)."""


async def write_file(sandbox: Any, path: str, text: str) -> None:
    await sandbox.editor("create", path, file_text=text, overwrite=True)


async def read_file(sandbox: Any, path: str, *, max_bytes: int, timeout_s: float = 30.0) -> bytes | None:
    """The file's bytes, or None when it does not exist; SandboxFileError when over ``max_bytes``."""
    data, offset, size = b"", 0, None
    while size is None or offset < size:
        command = (f"python3 -c {shlex.quote(_READ)} {shlex.quote(path)} {offset} {CHUNK_BYTES}")
        result = await sandbox.bash(command, timeout_s=timeout_s)
        reply = result.output.strip().split()
        if reply == ["MISSING"]:
            return None
        if len(reply) not in (1, 2) or not reply[0].isdigit() or result.exit_code != 0:
            raise SandboxFileError(f"cannot read {path}: {result.output.strip()[:300]}")
        size = int(reply[0])
        if size > max_bytes:
            raise SandboxFileError(f"{path} has {size} bytes, more than the {max_bytes} allowed")
        chunk = base64.b64decode(reply[1]) if len(reply) == 2 else b""
        if not chunk and offset < size:
            raise SandboxFileError(f"{path} shrank while it was read")
        data += chunk
        offset += len(chunk)
    return data
