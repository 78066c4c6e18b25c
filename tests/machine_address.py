"""A non-loopback address of this machine, for tests that must reach a server from somewhere else than loopback
(the status page's access rules): a connection from this machine to that address has it as its source address too,
so the server sees a peer that is not loopback."""

from __future__ import annotations

import ipaddress
import socket
import subprocess

DUMMY_INTERFACE = "ks-test0"
DUMMY_ADDRESS = "198.18.0.19"  # benchmarking range (RFC 2544): never routed, never in use here


def _usable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.version != 4:
        return False
    try:  # bound and reachable from here
        with socket.socket() as server, socket.socket() as client:
            server.bind((address, 0))
            server.listen(1)
            client.settimeout(3)
            client.connect((address, server.getsockname()[1]))
            peer = server.accept()[0]
            found = peer.getpeername()[0]
            peer.close()
            return found == address
    except OSError:
        return False


def non_loopback_address() -> str:
    """The address the default route leaves from, else any other of the machine's, else one put on a dummy
    interface (as root); raises RuntimeError saying why none can be had."""
    candidates = []
    try:  # the UDP connect trick: no packet is sent
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.123", 9))
            candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    try:
        candidates += subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    for address in candidates:
        if _usable(address):
            return address
    if not _usable(DUMMY_ADDRESS):
        for command in (
            ["ip", "link", "add", DUMMY_INTERFACE, "type", "dummy"],
            ["ip", "addr", "add", DUMMY_ADDRESS + "/32", "dev", DUMMY_INTERFACE],
            ["ip", "link", "set", DUMMY_INTERFACE, "up"],
        ):
            subprocess.run(command, capture_output=True, timeout=10)
    if _usable(DUMMY_ADDRESS):
        return DUMMY_ADDRESS
    raise RuntimeError(
        f"no non-loopback address on this machine, and none could be added ({DUMMY_INTERFACE}): candidates {candidates}"
    )
