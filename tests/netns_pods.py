"""Pods with a network of their own, for the Kubernetes stand-in (issue 34): each pod in a network
namespace with its own address on a bridge, and the Job's pod hostnames (``<job>-<index>.<service>``,
as the cluster DNS answers for a headless Service with ``publishNotReadyAddresses``) in every pod's
``/etc/hosts`` (``ip netns exec`` binds ``/etc/netns/<ns>/hosts`` there). A pod can be cut off from
the others (its veth down), as a node that loses its network. Needs root and iproute2."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """None when pods can have networks of their own here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


@dataclass
class Pod:
    name: str        # the pod's hostname, e.g. gang-0
    fqdn: str        # gang-0.svc
    netns: str
    address: str
    veth: str        # the bridge side of its link


@dataclass
class PodNetwork:
    """A bridge and the pods on it; ``key`` keeps concurrent networks (test workers) apart."""

    key: str
    pods: list[Pod] = field(default_factory=list)

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.key.encode()).digest()
        self.tag = digest.hex()[:6]
        self.subnet = f"10.{200 + digest[0] % 50}.{digest[1]}"  # a /24 of its own
        self.bridge = f"twb{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str, service: str) -> Pod:
        index = len(self.pods) + 1
        pod = Pod(name, f"{name}.{service}", f"tw{self.tag}-{index}", f"{self.subnet}.{index + 1}", f"twv{self.tag}{index}")
        inner = f"twp{self.tag}{index}"
        _ip("netns", "add", pod.netns)
        _ip("link", "add", pod.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", pod.netns)
        _ip("link", "set", pod.veth, "master", self.bridge)
        _ip("link", "set", pod.veth, "up")
        _ip("-n", pod.netns, "addr", "add", f"{pod.address}/24", "dev", inner)
        _ip("-n", pod.netns, "link", "set", inner, "up")
        _ip("-n", pod.netns, "link", "set", "lo", "up")
        self.pods.append(pod)
        self._write_hosts()
        return pod

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"] + [f"{p.address} {p.fqdn} {p.name}" for p in self.pods]
        for pod in self.pods:
            (NETNS_ETC / pod.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / pod.netns / "hosts").write_text("\n".join(lines) + "\n")

    def popen(self, pod: Pod, argv: list[str], **kwargs) -> subprocess.Popen:
        """``argv`` inside the pod's namespace (its own address, its hosts file)."""
        return subprocess.Popen(["ip", "netns", "exec", pod.netns, *argv], **kwargs)

    def cut(self, pod: Pod) -> None:
        """The pod loses its network: its link to the bridge goes down."""
        _ip("link", "set", pod.veth, "down")

    def close(self) -> None:
        for pod in self.pods:
            subprocess.run(["ip", "netns", "del", pod.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", pod.veth], capture_output=True)
            shutil.rmtree(NETNS_ETC / pod.netns, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
