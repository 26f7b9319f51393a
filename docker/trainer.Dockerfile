# The image each training pod runs: the trainer package and what it imports (torch, numpy, safetensors).
# Build from the repo root:  docker build -f docker/trainer.Dockerfile -t taxiway-trainer:<git-sha> .
#
# Base: the official PyTorch runtime image (torch's CUDA 13.0 wheels with cuDNN 9; this file assumes
# Python 3.11 and asserts it below: docker/README.md says what was and was not verified about the tag).
# torch 2.13.0's Linux wheels bundle their CUDA user-space libraries, so the host needs only the NVIDIA
# driver (>= 580 for CUDA 13.0) and the container toolkit / device plugin.
# Pinned by tag here; pin by digest at build time for bit-identical rebuilds (docker/README.md).
# `make images` passes a stand-in base (no registry here) and a CPU build's arguments (docker/README.md).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}
# where pip finds torch's CUDA wheels, and the CUDA major version torch must be built for ("cpu": none)
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ARG TORCH_CUDA=13

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# torch from the CUDA 13.0 wheel index (already in the base image: pip keeps it), the rest at the
# repo's pinned versions. The check fails the build if the base is not what this file assumes: Python
# 3.11, torch 2.13.0, built for CUDA ${TORCH_CUDA}.x (or for no CUDA at all when TORCH_CUDA=cpu).
COPY requirements/constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt \
        --extra-index-url="${TORCH_INDEX}" \
        torch==2.13.0 numpy==2.4.6 safetensors==0.8.0 \
    && python -c "import os, sys, torch; cuda = torch.version.cuda.split('.')[0] if torch.version.cuda else 'cpu'; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', cuda); assert sys.version_info[:2] == (3, 11), sys.version; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__; assert cuda == os.environ['TORCH_CUDA'], (torch.version.cuda, os.environ['TORCH_CUDA'])" \
    && rm /tmp/constraints.txt \
    && useradd --uid 10001 --gid 0 --no-create-home --home-dir /opt/taxiway --shell /usr/sbin/nologin taxiway

WORKDIR /opt/taxiway
COPY --chown=10001:0 trainer/ trainer/
ENV PYTHONPATH=/opt/taxiway
# uid 10001 = compute.kubernetes.run_as_user (the pods' runAsUser and fsGroup)
USER 10001

# No HEALTHCHECK: Kubernetes ignores it (the kubelet runs probes, not Docker health checks), and the
# trainer's liveness is its status.json heartbeat, which the orchestrator watches (docker/README.md).
# `python -m trainer --spec SPEC.json [--smoke]` runs one process; the training pods set
# `command: [torchrun]` explicitly (pipelines/launch/k8s.py), so torchrun starts the ranks there.
ENTRYPOINT ["python", "-m", "trainer"]
