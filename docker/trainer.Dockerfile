# The image each training pod runs: the trainer package and what it imports, nothing else.
# Build from the repo root:  docker build -f docker/trainer.Dockerfile -t taxiway-trainer:<git-sha> .
# Pods run: torchrun --nnodes N --node-rank $JOB_COMPLETION_INDEX ... -m trainer --spec <run>/train/spec.json
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN pip install --no-cache-dir torch==2.13.0 numpy==2.4.6 safetensors==0.8.0 \
    && useradd --uid 10001 --create-home taxiway

WORKDIR /opt/taxiway
COPY trainer/ trainer/
ENV PYTHONPATH=/opt/taxiway
USER 10001
ENTRYPOINT ["torchrun"]
