"""Each node's sandboxes in Redis: their loopback leases and their ownership ledger, shared by
every worker process of the node.

``RedisAddressAllocator`` and ``RedisSandboxLedger`` implement the protocols of
:mod:`singularity.runtime` (``AddressAllocator``, ``SandboxLedger``), so the runtimes stay free
of Redis while the workers on a node share one view of its loopback leases and its sandboxes.
"""
from __future__ import annotations

import ipaddress

import redis

from prorl_celery.state import keys
from prorl_celery.state.store import load_script
from singularity.runtime import AddressExhausted, ProcessRef, SandboxRecord

DEFAULT_NETWORK = "127.100.0.0/16"


class RedisAddressAllocator:
    """Unique 127.x.y.z leases per node, atomic across threads, processes and workers."""

    def __init__(self, client: redis.Redis, node: str, network: str = DEFAULT_NETWORK) -> None:
        net = ipaddress.IPv4Network(network)
        if not net.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"{network} is not inside 127.0.0.0/8")
        self.redis, self.node, self.network = client, node, network
        self._range = (int(net.network_address) + 1, int(net.broadcast_address) - 1)
        self._allocate = load_script(client, "allocate_address")
        self._release = load_script(client, "release_address")

    def allocate(self, owner: str) -> str:
        address = self._allocate(keys=[keys.node_addresses(self.node)], args=[*self._range, owner])
        if not address:
            raise AddressExhausted(f"every address of {self.network} on {self.node} is leased")
        return address

    def release(self, address: str, owner: str | None = None) -> None:
        self._release(keys=[keys.node_addresses(self.node)], args=[address, owner or ""])

    def leases(self) -> dict[str, str]:
        entries = self.redis.hgetall(keys.node_addresses(self.node))
        return {_text(k): _text(v) for k, v in entries.items()}


def _text(value: bytes | str) -> str:
    """A client made without ``decode_responses`` answers bytes."""
    return value.decode() if isinstance(value, bytes) else value


class RedisSandboxLedger:
    """Which sandboxes run on which node, owned by which worker process, and which failed to
    stop (one hash per node, field = sandbox id, value = the record's JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._transfer = load_script(client, "transfer_sandbox")

    def record(self, record: SandboxRecord) -> None:
        self.redis.hset(keys.node_sandboxes(record.node), record.sandbox_id, record.model_dump_json())

    def remove(self, node: str, sandbox_id: str) -> None:
        self.redis.hdel(keys.node_sandboxes(node), sandbox_id)

    def get(self, node: str, sandbox_id: str) -> SandboxRecord | None:
        entry = self.redis.hget(keys.node_sandboxes(node), sandbox_id)
        return SandboxRecord.model_validate_json(entry) if entry else None

    def list(self, node: str) -> list[SandboxRecord]:
        entries = self.redis.hgetall(keys.node_sandboxes(node))
        return [SandboxRecord.model_validate_json(entries[k]) for k in sorted(entries)]

    def transfer(self, node: str, sandbox_id: str, owner: ProcessRef, worker: str) -> bool:
        """Atomic: the new owner is written only over the entry as read (a compare-and-set in
        Redis), so a stop between the read and the write never re-creates the entry, and a
        failed stop marked meanwhile is kept."""
        return self._update(node, sandbox_id, {"owner": owner, "worker": worker})

    def assign(self, node: str, sandbox_id: str, job_id: str, expected: str | None = None) -> bool:
        """A warm pool's sandbox now serves ``job_id`` (the same compare-and-set as
        :meth:`transfer`): from here on the reaper asks that job's record whether it is held.
        ``expected``: the entry as the caller last saw it, tried first (one round trip, not two)."""
        return self._update(node, sandbox_id, {"job_id": job_id}, expected)

    def _update(self, node: str, sandbox_id: str, update: dict[str, object], expected: str | None = None) -> bool:
        key = keys.node_sandboxes(node)
        while True:  # another try only after another writer changed this very entry
            entry, expected = expected or self.redis.hget(key, sandbox_id), None
            if not entry:
                return False
            moved = SandboxRecord.model_validate_json(entry).model_copy(update=update)
            done = self._transfer(keys=[key], args=[sandbox_id, entry, moved.model_dump_json()])
            if done >= 0:
                return bool(done)
