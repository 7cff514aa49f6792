"""Network namespaces as stand-in nodes: N namespaces, each with a veth pair to one bridge in
the root namespace, addresses 10.77.<k>.<i>/24 (the root end of the bridge is .254).

Processes of node ``i`` start with ``ip netns exec <ns> ...``. Cutting a node off is
``ip link set <its root-side veth> down``. Everything is torn down on exit, also on failure,
and stale namespaces of dead test processes are removed at the next start.

Creating namespaces needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN; where that is missing (an
unprivileged CI container) :class:`NetnsUnavailable` carries the reason for a skip.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

PREFIX = "prorl-mn-"


class NetnsUnavailable(RuntimeError):
    """Namespaces, veth pairs or bridges cannot be created here (the message says why)."""


def ip(*args: str, namespace: str | None = None) -> str:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as error:
        raise NetnsUnavailable("iproute2 (`ip`) is not installed") from error
    if done.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Namespaces:
    """``count`` namespaces on one bridge; use as a context manager."""

    count: int
    tag: str = field(default_factory=lambda: str(os.getpid()))
    names: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    root_address: str = ""
    created: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name), for teardown

    @property
    def bridge(self) -> str:
        return f"prb{self.tag[-8:]}"

    def host_veth(self, index: int) -> str:
        return f"prv{self.tag[-8:]}h{index}"  # interface names are at most 15 characters

    def exec_prefix(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[index]]

    def set_link(self, index: int, up: bool) -> None:
        """Connect (up) or cut off (down) node ``index`` at its end of the bridge."""
        ip("link", "set", self.host_veth(index), "up" if up else "down")

    def __enter__(self) -> Namespaces:
        remove_stale()
        subnet = f"10.77.{int(self.tag) % 200 + 20}"
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            ip("addr", "add", f"{subnet}.254/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            self.root_address = f"{subnet}.254"
            for index in range(self.count):
                name, host_end = f"{PREFIX}{self.tag}-{index}", self.host_veth(index)
                ns_end = f"prv{self.tag[-8:]}n{index}"
                ip("netns", "add", name)
                self.created.append(("netns", name))
                ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                self.created.append(("link", host_end))
                ip("link", "set", ns_end, "netns", name)
                ip("link", "set", host_end, "master", self.bridge)
                ip("link", "set", host_end, "up")
                ip("addr", "add", f"{subnet}.{index + 1}/24", "dev", ns_end, namespace=name)
                ip("link", "set", ns_end, "up", namespace=name)
                ip("link", "set", "lo", "up", namespace=name)
                self.names.append(name)
                self.addresses.append(f"{subnet}.{index + 1}")
            problem = self.unreachable()
            if problem:
                raise NetnsUnavailable(problem)
        except BaseException:
            self.close()
            raise
        return self

    def unreachable(self) -> str | None:
        """Why some node cannot reach the others or the root namespace, or None. A refused TCP
        connection proves the path; a timeout means the bridge's traffic is filtered (for
        example br_netfilter with a DROP forward policy on a Docker host)."""
        probe = ("import errno, socket, sys\n"
                 "for host in sys.argv[1:]:\n"
                 "    s = socket.socket(); s.settimeout(3)\n"
                 "    code = s.connect_ex((host, 9))\n"
                 "    if code not in (0, errno.ECONNREFUSED): print(host, errno.errorcode.get(code, code))\n")
        targets = [*self.addresses, self.root_address]
        for index in range(len(self.names)):
            done = subprocess.run([*self.exec_prefix(index), sys.executable, "-c", probe, *targets],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0 or done.stdout.strip():
                return f"{self.names[index]} cannot reach {done.stdout.strip() or done.stderr.strip()}"
        return None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for kind, name in reversed(self.created):
            # deleting a namespace deletes its veth end, and with it the peer
            subprocess.run(["ip", kind, "del", name], capture_output=True, timeout=30)
        self.created.clear()


def remove_stale() -> None:
    """Delete namespaces and bridges left by test processes that died without tearing down."""
    listing = ip("netns", "list")
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            subprocess.run(["ip", "link", "del", f"prb{pid[-8:]}"], capture_output=True)
