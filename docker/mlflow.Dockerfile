# The MLflow tracking server and model registry (deploy/base/mlflow.yaml): PostgreSQL backend store,
# artifacts proxied by the server (--serve-artifacts) to S3 (--artifacts-destination s3://…, through
# boto3). Build from the repo root:
#   docker build -f docker/mlflow.Dockerfile -t taxiway-mlflow:3.17.2-<git-sha> .
# Pinned by tag here; pin by digest at build time for bit-identical rebuilds (docker/README.md).
# `make images` passes a stand-in base (no registry here; docker/README.md).
ARG BASE_IMAGE=python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements/constraints.txt /tmp/constraints.txt
# mlflow[auth]: the basic-auth app (deploy/base/mlflow.yaml) needs Flask-WTF, which the constraints do not pin
# boto3: the S3 artifact store (pinned in the constraints with botocore and s3transfer)
RUN pip install --no-cache-dir -c /tmp/constraints.txt "mlflow[auth]==3.17.2" flask-wtf==1.3.0 wtforms==3.3.2 \
        psycopg2-binary==2.9.13 boto3==1.43.117 \
    && rm /tmp/constraints.txt \
    && useradd --uid 10002 --gid 0 --create-home --home-dir /home/mlflow --shell /usr/sbin/nologin mlflow

WORKDIR /home/mlflow
USER 10002
EXPOSE 5000
# No HEALTHCHECK: Kubernetes ignores it; deploy/base/mlflow.yaml probes GET /health.
# Every server option comes from the environment (MLFLOW_BACKEND_STORE_URI from a Secret, ...).
ENTRYPOINT ["mlflow", "server"]
