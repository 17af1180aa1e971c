"""A private network for tests: a bridge on the host and network namespaces linked to it, one
per process, each link cut and healed at will (a network partition of that process)::

    with private_network() as network:          # a bridge with 10.X.Y.1/24 on the host
        broker = ActiveMQ(host=network.address)  # brokers listen on the bridge's address
        room = network.namespace()              # a namespace with 10.X.Y.K, linked to the bridge
        subprocess.Popen([*room.prefix, sys.executable, ...])  # a process inside it
        room.cut()                              # its link down: every packet dropped, no reset
        room.heal()                             # up again: TCP retransmits what was held back
    # namespaces, links and the bridge are deleted, also when the test failed

A cut sets the host end of the namespace's veth pair down: both ends lose their carrier, the
kernels on both sides keep their sockets and retransmit into the void, exactly as when a cable
or a switch fails. Nothing is reset: whoever notices first is the one whose heart-beats say so.

Names are unique per network (a random token in every interface and namespace name), the
subnet is one no route of this machine uses, and ``close`` (also at interpreter exit) deletes
all of it; deleting a namespace deletes its veth pair. Needs root (CAP_NET_ADMIN) and
iproute2: ``network_available`` says whether this machine has them.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Namespace", "Network", "network_available", "private_network"]

_open: set[Network] = set()


def network_available() -> bool:
    """True when this process may make namespaces and links (root, with ``ip``)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; its output. ``RuntimeError`` with ip's own words if it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _unused_subnet() -> ipaddress.IPv4Network:
    """A 10.X.Y.0/24 that overlaps no route or address of this machine."""
    taken = [ipaddress.ip_network(word, strict=False)
             for line in (_ip("-4", "route", "show", "table", "all")
                          + _ip("-4", "-o", "addr")).splitlines()
             for word in line.split() if "/" in word and word[0].isdigit()]
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.{random.randrange(64, 255)}."
                                       f"{random.randrange(1, 255)}.0/24")
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError("no unused 10.X.Y.0/24 subnet found")


class Namespace:
    """One network namespace linked to the network's bridge by a veth pair. Made by
    ``Network.namespace``."""

    def __init__(self, name: str, host_end: str, address: str) -> None:
        self.name = name
        self.host_end = host_end
        self.address = address  # its own address on the bridge's subnet
        self.is_cut = False

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a command inside this namespace (the command keeps the
        PID it is started with: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Take the link down: from now on no packet passes either way."""
        _ip("link", "set", self.host_end, "down")
        self.is_cut = True

    def heal(self) -> None:
        """Bring the link up again."""
        _ip("link", "set", self.host_end, "up")
        self.is_cut = False

    def __repr__(self) -> str:
        return f"<Namespace {self.name} {self.address} {'cut' if self.is_cut else 'up'}>"


class Network:
    """A bridge with its own subnet on the host, and the namespaces made on it. ``create`` it
    before starting a broker on ``address``; ``close`` deletes everything it made."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)
        self.bridge = f"mdb{self.token}b"  # interface names have at most 15 characters
        self.subnet = _unused_subnet()
        hosts = self.subnet.hosts()
        self.address = str(next(hosts))  # the host's end: brokers listen here
        self._free = hosts
        self.namespaces: list[Namespace] = []
        self._created = False

    def create(self) -> Network:
        """Make the bridge and give the host its address on it."""
        _open.add(self)
        self._created = True
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def namespace(self) -> Namespace:
        """A new namespace with the next address of the subnet, linked to the bridge (its
        loopback up too)."""
        index = len(self.namespaces)
        name = f"mdb-{self.token}-{index}"
        host_end, inner_end = f"mdb{self.token}h{index}", f"mdb{self.token}n{index}"
        address = str(next(self._free))
        _ip("netns", "add", name)
        self.namespaces.append(Namespace(name, host_end, address))
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
        _ip("link", "set", inner_end, "netns", name)
        _ip("link", "set", host_end, "master", self.bridge)
        _ip("link", "set", host_end, "up")
        inside = ["netns", "exec", name, "ip"]
        _ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner_end)
        _ip(*inside, "link", "set", inner_end, "up")
        _ip(*inside, "link", "set", "lo", "up")
        return self.namespaces[-1]

    def close(self) -> None:
        """Delete the namespaces (and with them their links) and the bridge; never raises."""
        for namespace in self.namespaces:
            _quietly("netns", "delete", namespace.name)
            _quietly("link", "delete", namespace.host_end)  # gone already, unless half-made
        self.namespaces.clear()
        if self._created:
            _quietly("link", "delete", self.bridge)
            self._created = False
        _open.discard(self)

    def __repr__(self) -> str:
        return f"<Network {self.bridge} {self.subnet} namespaces {self.namespaces}>"


def _quietly(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, timeout=30, check=False)


@contextmanager
def private_network() -> Iterator[Network]:
    """A created ``Network``, closed at the end whatever happened."""
    network = Network()
    try:
        yield network.create()
    finally:
        network.close()


@atexit.register
def _delete_leftovers() -> None:
    # A test run that dies half-way must not leave namespaces or bridges behind.
    for network in list(_open):
        network.close()
