"""The pod network of the Kubernetes stand-in (``netns_pods.py``, issue 34): two pods, each in a
network namespace of its own, meet at a torch.distributed c10d store by the Job's pod hostname
(``<job>-0.<service>``) and all-reduce over gloo across the namespaces; a pod whose link is cut
reaches nobody."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netns_pods
import pytest

pytestmark = pytest.mark.skipif(netns_pods.available() is not None, reason=str(netns_pods.available()))

RANK = """
import datetime, os, socket, sys
import torch, torch.distributed as dist
rank = int(sys.argv[1])
os.environ["GLOO_SOCKET_IFNAME"] = [n for _, n in socket.if_nameindex() if n != "lo"][0]
dist.init_process_group("gloo", init_method="tcp://gang-0.svc:29511", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=float(sys.argv[2])))
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(socket.gethostbyname("gang-0.svc"), socket.gethostbyname("gang-1.svc"), t.item(), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture()
def network(request):
    net = netns_pods.PodNetwork(request.node.nodeid)
    yield net
    net.close()


def _ranks(net: netns_pods.PodNetwork, pods, timeout_s: float) -> list[subprocess.Popen]:
    return [net.popen(pod, [sys.executable, "-c", RANK, str(rank), str(timeout_s)], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
                      cwd=Path(__file__).parent)
            for rank, pod in enumerate(pods)]


def test_two_pods_in_namespaces_of_their_own_meet_by_the_jobs_hostname(network):
    pods = [network.add(f"gang-{i}", "svc") for i in range(2)]
    assert len({p.address for p in pods}) == 2
    procs = _ranks(network, pods, 60)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    for out, _ in outs:  # each resolved both names to the pods' own addresses, and the sum crossed namespaces
        assert out.split() == [pods[0].address, pods[1].address, "3.0"], out


def test_a_pod_cut_off_reaches_nobody(network):
    pods = [network.add(f"gang-{i}", "svc") for i in range(2)]
    network.cut(pods[1])
    probe = network.popen(pods[1], [sys.executable, "-c", "import socket; s = socket.socket(); s.settimeout(2); "
                                    "s.connect(('gang-0.svc', 29511))"], stderr=subprocess.PIPE, text=True)
    _, err = probe.communicate(timeout=30)
    assert probe.returncode != 0 and ("timed out" in err or "unreachable" in err or "No route" in err), err


def test_a_pod_added_later_is_named_in_the_hosts_of_pods_already_running(network):
    """As the cluster DNS names a pod once it has an address, a running pod resolves a pod created after it."""
    first = network.add("gang-0", "svc")
    waiting = network.popen(first, [sys.executable, "-c", "import socket, sys, time\nfor i in range(300):\n"
                                     "    try:\n        print(socket.gethostbyname('gang-1.svc')); break\n"
                                     "    except OSError:\n        i or print('unknown', flush=True); time.sleep(0.1)"],
                            stdout=subprocess.PIPE, text=True)
    assert waiting.stdout.readline().strip() == "unknown"  # it looked the name up before the pod existed
    second = network.add("gang-1", "svc")
    out, _ = waiting.communicate(timeout=60)
    assert out.strip() == second.address



def test_a_pod_added_while_another_is_named_is_named_in_both(network, monkeypatch):
    """The stand-in's kubelet adds a Job's pods from a thread each: a hosts file written from an older
    view of the subdomain, after a newer one, would leave that pod blind to the other for good. Here the
    first pod's hosts file is opened late, and the second pod is added meanwhile."""
    import os
    import threading

    opening, real_open = threading.Event(), os.open

    def slow_open(path, flags: int, *args):
        if str(path).endswith("/hosts") and not opening.is_set():  # the first pod's view, before it is written
            opening.set()
            threading.Event().wait(1.0)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", slow_open)
    first = threading.Thread(target=network.add, args=("gang-0", "svc"))
    first.start()
    assert opening.wait(30)
    network.add("gang-1", "svc")
    first.join()
    for pod in network.pods:
        names = (netns_pods.NETNS_ETC / pod.netns / "hosts").read_text().split()
        assert {"gang-0.svc", "gang-1.svc"} <= set(names), (pod.name, names)
