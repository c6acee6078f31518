"""A private network for `sitsctl demo --transport eth`: the PLC simulator in its own network
namespace, joined to this one by a veth pair, so UADP crosses a real Ethernet link (VLAN tag,
PCP, kernel RX stamps) and OPC UA crosses real IP addresses. Needs root; removed on close.
"""
from __future__ import annotations

import os
import random
import subprocess

from .errors import StartupError


class DemoLink:
    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise StartupError("--transport eth creates a network namespace and raw sockets: run it as root")
        tag = f"{os.getpid() % 1000:03d}{random.randint(0, 999):03d}"
        self.netns = f"sits-plc-{tag}"
        self.plc_if, self.host_if = f"vplc{tag}", f"vsit{tag}"
        subnet = random.randint(0, 63) * 4
        octet = random.randint(1, 254)
        self.plc_ip, self.host_ip = f"10.213.{octet}.{subnet + 1}", f"10.213.{octet}.{subnet + 2}"
        self._up = False

    def _ip(self, *args: str) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise StartupError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def open(self) -> "DemoLink":
        self._ip("netns", "add", self.netns)
        self._up = True
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.plc_if, "netns", self.netns)
        self._ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        self._ip("-n", self.netns, "link", "set", "lo", "up")
        self._ip("-n", self.netns, "addr", "add", f"{self.plc_ip}/30", "dev", self.plc_if)
        self._ip("-n", self.netns, "link", "set", self.plc_if, "up")
        return self

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def close(self) -> None:
        if self._up:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)  # removes the veth pair too
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
            self._up = False
