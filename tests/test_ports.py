"""Ports where nothing may listen stay so for as long as a test needs (tests.ports'
``refusing_port``, a TcpProxy before it starts and while it is cut): connections are
refused, and no other process can take the port meanwhile; and the ports servers are
started on come from below the kernel's ephemeral range, where no socket of the machine's
lands by itself."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.ports import free_port, refusing_port
from tests.tcp_proxy import TcpProxy


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def another_can_listen(port: int) -> bool:
    """Whether another server (SO_REUSEADDR, as most set it) could listen on ``port``."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind(("127.0.0.1", port))
            other.listen()
        except OSError:
            return False
    return True


def test_a_refusing_port_refuses_and_cannot_be_taken() -> None:
    with refusing_port() as port:
        assert refused(port)
        assert not another_can_listen(port)
        assert refused(port)


def test_a_proxy_port_refuses_and_cannot_be_taken_before_it_starts_and_while_cut() -> None:
    """On the old code the proxy only picked its port: another server could listen there
    before the proxy started, or while it was cut, and the proxy then failed to listen."""
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        proxy = TcpProxy("127.0.0.1", upstream.getsockname()[1])
        try:
            assert refused(proxy.port)
            assert not another_can_listen(proxy.port)
            proxy.start()
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5):
                upstream.settimeout(5)
                upstream.accept()[0].close()  # passed on to the upstream
            proxy.cut()
            assert refused(proxy.port)
            assert not another_can_listen(proxy.port)
            proxy.restore()
            assert not refused(proxy.port)
        finally:
            proxy.close()
    assert another_can_listen(proxy.port)  # closed, the port is let go


def test_free_ports_are_below_the_ephemeral_range() -> None:
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not range_file.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range (not Linux)")
    low = int(range_file.read_text().split()[0])
    if low < 22000:
        pytest.skip(f"this machine's ephemeral range starts at {low}: free_port uses the kernel's pick")
    picked = {free_port() for _ in range(20)}
    assert all(20000 <= port < low for port in picked), picked
