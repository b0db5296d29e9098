"""Silent network partitions for the fault suite: a network namespace of the test's own,
reached from the host by two veth pairs ("paths"), with a virtual IP on its loopback that
the host routes through one path or the other.

A path is blackholed by a static neighbour entry with a MAC address nobody has, on each
side: every frame either way goes nowhere, no RST, no ICMP, so a client waits until its
kernel gives up retransmitting (``tcp_retries2``) or its own timeouts say otherwise.
``heal`` deletes the entries and the retransmissions get through. ``move_virtual_ip``
routes the virtual IP through the other path, as a failover moves a VIP or a DNS name:
connections made from then on work, and the namespace's strict reverse-path filter drops
the packets of those made before (their source address belongs to the dead path), so
they stay dead for good.

Names are unique per run (``nxt`` + the pid + a counter); :meth:`Partitions.cleanup`
deletes the veths (both ends, their routes and neighbour entries go with them) and the
namespace. Nothing else of the machine is touched: no other interface, route or firewall.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import IN_CI

#: A MAC address no interface has: frames sent to it are dropped without a word.
NOWHERE = "02:00:00:00:00:99"
_counter = itertools.count()


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, "ip", *args], check=check, capture_output=True, text=True, timeout=30)


#: Capabilities a network namespace and veth pairs take (bits of /proc/self/status CapEff).
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def _effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def namespaces_missing() -> str | None:
    """Why this process cannot make a network namespace with veths, or ``None``."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not available; bin/test installs it"
    capabilities = _effective_capabilities()
    if not all(capabilities >> bit & 1 for bit in (CAP_NET_ADMIN, CAP_SYS_ADMIN)):
        return (
            "the partition tests make a network namespace and veth pairs: they need root "
            "(CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )
    return None


def require_namespaces() -> None:
    """A failure in CI (bin/fault-deps checks for them), a skip elsewhere."""
    reason = namespaces_missing()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True)
class VethPath:
    """One veth pair: ``host_device`` (``host_address``) in the host's namespace,
    ``inner_device`` (``inner_address``) in the test's."""

    host_device: str
    inner_device: str
    host_address: str
    inner_address: str


class Partitions:
    """See the module. ``create()`` builds it; ``inner_command(...)`` prefixes a command
    to run inside the namespace; ``virtual_ip`` starts routed through path 0."""

    def __init__(self) -> None:
        tag = f"nxt{os.getpid():x}{next(_counter):x}"
        self.netns = tag
        octet = self._free_octet()
        prefix = f"10.213.{octet}"
        self.subnet = f"{prefix}.0/24"
        self.paths = [
            VethPath(f"{tag}h{n}", f"{tag}n{n}", f"{prefix}.{4 * n + 1}", f"{prefix}.{4 * n + 2}")
            for n in (0, 1)
        ]
        self.virtual_ip = f"{prefix}.9"
        self._created: list[str] = []

    @staticmethod
    def _free_octet() -> int:
        """A third octet of 10.213.x.0/24 no interface of the host uses (another test
        run's, say)."""
        used = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
        free = [n for n in range(256) if f"10.213.{n}." not in used]
        if not free:
            raise AssertionError("every 10.213.x.0/24 is in use")
        return random.choice(free)

    def inner_command(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *command]

    def create(self) -> None:
        _ip("netns", "add", self.netns)
        self._created.append("netns")
        _ip("link", "set", "lo", "up", netns=self.netns)
        _ip("addr", "add", f"{self.virtual_ip}/32", "dev", "lo", netns=self.netns)
        for path in self.paths:
            _ip("link", "add", path.host_device, "type", "veth", "peer", "name", path.inner_device)
            self._created.append(path.host_device)
            _ip("link", "set", path.inner_device, "netns", self.netns)
            _ip("addr", "add", f"{path.host_address}/30", "dev", path.host_device)
            _ip("link", "set", path.host_device, "up")
            _ip("addr", "add", f"{path.inner_address}/30", "dev", path.inner_device, netns=self.netns)
            _ip("link", "set", path.inner_device, "up", netns=self.netns)
        # Strict reverse-path filtering inside (the namespace's own sysctls): a packet
        # from one path's host address that arrives by the other path is dropped.
        for device in ("all", *(path.inner_device for path in self.paths)):
            subprocess.run(
                self.inner_command("sysctl", "-q", "-w", f"net.ipv4.conf.{device}.rp_filter=1"),
                check=True,
                capture_output=True,
                timeout=30,
            )
        self._route_virtual_ip(self.paths[0])

    def _route_virtual_ip(self, path: VethPath) -> None:
        _ip(
            "route", "replace", f"{self.virtual_ip}/32",
            "via", path.inner_address, "dev", path.host_device, "src", path.host_address,
        )  # fmt: skip

    def blackhole(self, number: int) -> None:
        """Every frame of path ``number``, either way, goes to a MAC nobody has."""
        path = self.paths[number]
        _ip(
            "neigh",
            "replace",
            path.inner_address,
            "lladdr",
            NOWHERE,
            "dev",
            path.host_device,
            "nud",
            "permanent",
        )
        _ip(
            "neigh", "replace", path.host_address, "lladdr", NOWHERE,
            "dev", path.inner_device, "nud", "permanent", netns=self.netns,
        )  # fmt: skip

    def heal(self, number: int) -> None:
        path = self.paths[number]
        _ip("neigh", "del", path.inner_address, "dev", path.host_device)
        _ip("neigh", "del", path.host_address, "dev", path.inner_device, netns=self.netns)

    def move_virtual_ip(self, number: int) -> None:
        """Route the virtual IP through path ``number``: new connections take it."""
        self._route_virtual_ip(self.paths[number])

    def cleanup(self) -> None:
        """Delete what ``create`` made (each step on its own: one failing does not keep
        the others from running)."""
        for made in reversed(self._created):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if made == "netns":
                    _ip("netns", "del", self.netns, check=False)
                else:
                    _ip("link", "del", made, check=False)
        self._created.clear()
