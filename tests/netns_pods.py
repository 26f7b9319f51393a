"""Pods with a network of their own, for the Kubernetes stand-in (``fake_kube.py``, issue 34): each pod
in a network namespace with its own address on a bridge, and the pod hostnames of its subdomain
(``<job>-<index>.<service>``, as the cluster DNS answers for a headless Service with
``publishNotReadyAddresses``) in the ``/etc/hosts`` of every pod of that subdomain (``ip netns exec``
binds ``/etc/netns/<ns>/hosts`` there). A pod can be cut off from the others (its veth down), as a
node that loses its network. Needs root and iproute2."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """None when pods can have networks of their own here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2 (ip) or util-linux (unshare) is not installed"
    return None


@dataclass
class Pod:
    name: str        # the pod's hostname, e.g. gang-0
    fqdn: str        # gang-0.svc
    subdomain: str   # the headless Service whose DNS names it
    cluster_fqdn: str  # gang-0.svc.<namespace>.svc.cluster.local
    netns: str
    address: str
    veth: str        # the bridge side of its link


@dataclass
class PodNetwork:
    """A bridge and the pods on it; ``key`` keeps concurrent networks (test workers) apart. Two
    networks may hold the same /24: each bridge is an L2 segment of its own and the host has no
    address on either."""

    key: str
    pods: list[Pod] = field(default_factory=list)

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.key.encode()).digest()
        self.tag = digest.hex()[:6]
        self.subnet = f"10.{200 + digest[0] % 50}.{digest[1]}"
        self.bridge = f"twb{self.tag}"
        self.lock = threading.Lock()
        self.next_index = 1
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str, subdomain: str, namespace: str = "default") -> Pod:
        """A pod ``name`` on the bridge, named ``name.subdomain`` (and its cluster FQDN) for its subdomain."""
        with self.lock:
            index = self.next_index
            self.next_index += 1
            if index > 250:
                raise RuntimeError(f"pod network {self.key}: more than 250 pods")
        pod = Pod(name, f"{name}.{subdomain}", subdomain, f"{name}.{subdomain}.{namespace}.svc.cluster.local",
                  f"tw{self.tag}-{index}", f"{self.subnet}.{index + 1}", f"twv{self.tag}{index}")
        inner = f"twp{self.tag}{index}"
        _ip("netns", "add", pod.netns)
        _ip("link", "add", pod.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", pod.netns)
        _ip("link", "set", pod.veth, "master", self.bridge)
        _ip("link", "set", pod.veth, "up")
        _ip("-n", pod.netns, "addr", "add", f"{pod.address}/24", "dev", inner)
        _ip("-n", pod.netns, "link", "set", inner, "up")
        _ip("-n", pod.netns, "link", "set", "lo", "up")
        with self.lock:
            self.pods.append(pod)
        self._write_hosts(subdomain)
        return pod

    def _write_hosts(self, subdomain: str) -> None:
        """Under the lock from the look at the pods to the last write: pods are added from a thread each,
        and a view written after a newer one would leave a pod blind to the newest for good."""
        with self.lock:
            group = [p for p in self.pods if p.subdomain == subdomain]
            lines = ["127.0.0.1 localhost"] + [f"{p.address} {p.fqdn} {p.cluster_fqdn} {p.name}" for p in group]
            data = ("\n".join(lines) + "\n").encode()
            for pod in group:
                folder = NETNS_ETC / pod.netns
                folder.mkdir(parents=True, exist_ok=True)
                # rewritten in place, in one write: a running pod sees the file through a bind mount of
                # its inode, which a rename would leave behind (as DNS, a name may be missing for a moment)
                fd = os.open(folder / "hosts", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)

    def exec_prefix(self, pod: Pod) -> list[str]:
        """What runs a command inside the pod's network namespace (its own address and hosts file)."""
        return ["ip", "netns", "exec", pod.netns]

    def popen(self, pod: Pod, argv: list[str], **kwargs) -> subprocess.Popen:
        """``argv`` inside the pod's namespace."""
        return subprocess.Popen([*self.exec_prefix(pod), *argv], **kwargs)

    def cut(self, pod: Pod) -> None:
        """The pod loses its network: its link to the bridge goes down."""
        _ip("link", "set", pod.veth, "down")

    def remove(self, pod: Pod) -> None:
        """The pod is gone: its namespace, link and hosts file with it; the others no longer name it."""
        subprocess.run(["ip", "netns", "del", pod.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", pod.veth], capture_output=True)
        shutil.rmtree(NETNS_ETC / pod.netns, ignore_errors=True)
        with self.lock:
            if pod in self.pods:
                self.pods.remove(pod)
        self._write_hosts(pod.subdomain)

    def close(self) -> None:
        for pod in list(self.pods):
            self.remove(pod)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
