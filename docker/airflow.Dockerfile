# Airflow with Taxiway's DAGs, plugins and pipeline code baked in (api-server, scheduler, dag-processor,
# Celery workers, triggerer). Build from the repo root:
#   docker build -f docker/airflow.Dockerfile -t taxiway-airflow:<git-sha> .
# Pinned by tag here; pin by digest at build time for bit-identical rebuilds (docker/README.md).
# `make images` passes a stand-in base (no registry here) and a local torch wheel (docker/README.md).
ARG BASE_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${BASE_IMAGE}
# where pip finds torch's CPU wheel; PIP_FIND_LINKS (unset by default, pip reads it) adds a folder of wheels
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS

ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# uid 50000 is the image's airflow user; the chart runs the pods as uid 10001 with gid 0, which the
# official image supports (deploy/airflow-values.yaml: the same uid as the trainer pods on the shared volume)
USER 0
COPY --chown=50000:0 . /opt/taxiway
USER 50000
# 1. torch's CPU build: the workers run the trainer's --smoke and evaluation on CPU; the CUDA wheels
#    (several GB) belong in the trainer image only.
# 2. this package and the providers, everything at the repo's pinned versions; apache-airflow is named so
#    that pip never moves the image's Airflow (the official image's advice for adding packages).
RUN pip install --no-cache-dir --no-deps --index-url="${TORCH_CPU_INDEX}" torch==2.13.0 \
    && pip install --no-cache-dir -c /opt/taxiway/requirements/constraints.txt \
        apache-airflow==3.3.2 \
        apache-airflow-providers-cncf-kubernetes==10.25.0 \
        apache-airflow-providers-celery==3.26.0 \
        /opt/taxiway

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/taxiway/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/taxiway/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    TAXIWAY_CONFIG=/opt/taxiway/configs/demo.yaml
