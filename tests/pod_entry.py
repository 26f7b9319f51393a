"""A container's start, as the kubelet and the runtime do it, for the Kubernetes stand-in
(``fake_kube.py``): run inside the pod's network namespace and a UTS namespace of its own, it sets the
pod's hostname, mounts the pod's volumes (a folder bound at its ``mountPath``; an ``emptyDir`` of
medium Memory as a tmpfs of its ``sizeLimit``), enters ``workingDir`` and replaces itself with the
container's command, in exactly the environment the kubelet computed (nothing inherited).

    python pod_entry.py '<json: hostname, mounts, cwd, env, argv>'
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    socket.sethostname(spec["hostname"])
    for mount in spec["mounts"]:
        os.makedirs(mount["path"], exist_ok=True)
        if mount["kind"] == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mount['size']}", "tmpfs", mount["path"]], check=True)
        elif os.path.realpath(mount["source"]) != os.path.realpath(mount["path"]):
            subprocess.run(["mount", "--bind", mount["source"], mount["path"]], check=True)
    os.chdir(spec["cwd"])
    env = spec["env"]
    argv = spec["argv"]
    program = shutil.which(argv[0], path=env.get("PATH", "")) or argv[0]
    os.execve(program, argv, env)


if __name__ == "__main__":
    main()
