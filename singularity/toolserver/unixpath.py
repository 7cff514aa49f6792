"""Unix socket paths of any length: the kernel takes at most 107 bytes in ``sockaddr_un``.

A sandbox's socket lives in its state directory, which can be deep (a cluster's shared scratch,
a test's temporary directory). A longer path is reached through an ``O_PATH`` descriptor of its
directory, ``/proc/self/fd/<fd>/<name>``: short, thread-safe (no ``chdir``), and the same inode.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: longer paths (in bytes) go through /proc/self/fd; sockaddr_un holds 108 with the final NUL
DIRECT_LIMIT = 100


@contextmanager
def usable_path(path: str | os.PathLike) -> Iterator[str]:
    """A path ``bind``/``connect`` accept for the socket at ``path``, valid inside the block."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= DIRECT_LIMIT:
        yield text
        return
    location = Path(text)
    fd = os.open(location.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{location.name}"
    finally:
        os.close(fd)
