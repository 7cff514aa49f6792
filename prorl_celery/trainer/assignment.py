"""Two-phase assignment of LLM backends to several rollout deployments.

A trainer that runs more than one rollout deployment (each its own gateway, workers and Redis)
must split its inference servers between them. As in ProRL Agent:

1. **same node first**: a backend goes to a deployment on its own node (same IP address), the
   least loaded one when the node holds several, so a rollout's tokens need not leave the node;
2. **round robin for the rest**: every backend with no deployment on its node goes to the
   deployment holding the fewest backends so far (ties in the order given), which is plain round
   robin when the shares are even and evens them out when phase 1 was lopsided.

Nodes are compared by IP address: host names are resolved, and every loopback address counts as
one node. :func:`assign_backends` is pure apart from that resolution, which a caller (or a test)
can replace.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from functools import lru_cache
from urllib.parse import urlsplit

LOOPBACK = "loopback"


@lru_cache(maxsize=1024)
def resolve_host(host: str) -> str:
    """The host's IP address (``loopback`` for any loopback address); the name if unresolvable."""
    host = host.strip("[]").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0])
        except (OSError, ValueError, IndexError):
            return host
    return LOOPBACK if address.is_loopback else str(address)


def node_of(url: str, resolve: Callable[[str], str] = resolve_host) -> str:
    """The node a URL (``http://host:port/...``, or a bare ``host:port``) points at."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    return resolve(host)


def assign_backends(deployments: Sequence[str], backends: Sequence[str], *,
                    resolve: Callable[[str], str] = resolve_host) -> dict[str, list[str]]:
    """Map every deployment (a URL on its node) to the backends (URLs) it should register.

    Every backend is assigned exactly once; a deployment may get none when there are fewer
    backends than deployments. Duplicates in either list are ignored.
    """
    names = list(dict.fromkeys(deployments))
    if not names:
        raise ValueError("give at least one deployment")
    plan: dict[str, list[str]] = {name: [] for name in names}
    nodes = {name: node_of(name, resolve) for name in names}
    rest = []
    for backend in dict.fromkeys(backends):
        local = [name for name in names if nodes[name] == node_of(backend, resolve)]
        if local:
            _least_loaded(plan, local).append(backend)
        else:
            rest.append(backend)
    for backend in rest:
        _least_loaded(plan, names).append(backend)
    return plan


def _least_loaded(plan: dict[str, list[str]], candidates: list[str]) -> list[str]:
    """The share of the candidate with the fewest backends (the first such in order)."""
    return plan[min(candidates, key=lambda name: len(plan[name]))]
