# The image each training pod runs: the trainer package and what it imports (torch, numpy, safetensors).
# Build from the repo root:  docker build -f docker/trainer.Dockerfile -t taxiway-trainer:<git-sha> .
#
# Base: the official PyTorch runtime image (Ubuntu 22.04, Python 3.11, torch's CUDA 13.0 wheels with
# cuDNN 9). torch 2.13.0's Linux wheels bundle their CUDA user-space libraries, so the host needs only
# the NVIDIA driver (>= 580 for CUDA 13.0) and the container toolkit / device plugin.
# Pinned by tag here; pin by digest at build time for bit-identical rebuilds (docker/README.md).
FROM pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# torch from the CUDA 13.0 wheel index (already in the base image: pip keeps it), the rest at the
# repo's pinned versions. The check fails the build if the base tag is not what this file assumes.
COPY requirements/constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt \
        --extra-index-url https://download.pytorch.org/whl/cu130 \
        torch==2.13.0 numpy==2.4.6 safetensors==0.8.0 \
    && python -c "import sys, torch; assert sys.version_info[:2] == (3, 11), sys.version; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__; assert torch.version.cuda and torch.version.cuda.startswith('13.'), torch.version.cuda" \
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
