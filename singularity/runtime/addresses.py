"""Loopback addresses: each sandbox on a node gets its own 127.x.y.z.

Services a task starts inside a sandbox with networking on (a web server on port 8000) then
never collide with another sandbox's. The lease must be unique across every thread and process
of every worker on the node. :class:`AddressAllocator` is the interface; the service's
Redis-backed allocator (one lease set per node) lives in ``prorl_celery``. Here:

* :class:`FileAddressAllocator`: leases in a JSON file guarded by ``flock``; safe across
  threads and processes of one node (each call opens its own file description, and flock locks
  conflict between descriptions). For tests and the plain single-node use case.
* :class:`MemoryAddressAllocator`: one process only.

Addresses are handed out lowest first from a network inside 127.0.0.0/8 (default
127.100.0.0/16), skipping x.y.z.0, x.y.z.255 and 127.0.0.1.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import AddressExhausted

DEFAULT_NETWORK = "127.100.0.0/16"


@runtime_checkable
class AddressAllocator(Protocol):
    """Leases unique loopback addresses to owners (sandbox ids)."""

    def allocate(self, owner: str) -> str:
        """A free address, now leased to ``owner`` (raises :class:`AddressExhausted`)."""

    def release(self, address: str, owner: str | None = None) -> None:
        """End the lease of ``address`` (no error when it was not leased); with ``owner``, only
        while the lease is still that owner's (a late second release must not free an address
        that was leased again meanwhile)."""

    def leases(self) -> dict[str, str]:
        """Every current lease: address -> owner."""


def _loopback_network(network: str) -> str:
    if not ipaddress.IPv4Network(network).subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
        raise ValueError(f"{network} is not inside 127.0.0.0/8")
    return network


def _candidates(network: str) -> Iterator[str]:
    for address in ipaddress.IPv4Network(network).hosts():
        last = int(address) & 0xFF
        if last not in (0, 255) and str(address) != "127.0.0.1":
            yield str(address)


def _first_free(network: str, taken: dict[str, str]) -> str:
    for address in _candidates(network):
        if address not in taken:
            return address
    raise AddressExhausted(f"every address of {network} is leased ({len(taken)} leases)")


class MemoryAddressAllocator:
    """Leases held in this process only (thread-safe)."""

    def __init__(self, network: str = DEFAULT_NETWORK) -> None:
        self.network = _loopback_network(network)
        self._leases: dict[str, str] = {}
        self._lock = threading.Lock()

    def allocate(self, owner: str) -> str:
        with self._lock:
            address = _first_free(self.network, self._leases)
            self._leases[address] = owner
            return address

    def release(self, address: str, owner: str | None = None) -> None:
        with self._lock:
            if owner is None or self._leases.get(address) == owner:
                self._leases.pop(address, None)

    def leases(self) -> dict[str, str]:
        with self._lock:
            return dict(self._leases)


class FileAddressAllocator:
    """Leases in ``path`` (JSON), every read-modify-write under an exclusive ``flock``."""

    def __init__(self, path: Path | str, network: str = DEFAULT_NETWORK) -> None:
        self.path = Path(path)
        self.network = _loopback_network(network)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def _locked(self) -> Iterator[dict[str, str]]:
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            leases = self._read()
            before = dict(leases)
            yield leases
            if leases != before:
                self._write(leases)
        finally:
            os.close(fd)  # closing the description drops the lock

    def _read(self) -> dict[str, str]:
        try:
            return json.loads(self.path.read_text() or "{}")
        except FileNotFoundError:
            return {}

    def _write(self, leases: dict[str, str]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(leases, sort_keys=True))
        os.replace(tmp, self.path)  # readers outside the lock never see half a file

    def allocate(self, owner: str) -> str:
        with self._locked() as leases:
            address = _first_free(self.network, leases)
            leases[address] = owner
        return address

    def release(self, address: str, owner: str | None = None) -> None:
        with self._locked() as leases:
            if owner is None or leases.get(address) == owner:
                leases.pop(address, None)

    def leases(self) -> dict[str, str]:
        with self._locked() as leases:
            return dict(leases)
