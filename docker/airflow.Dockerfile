# Airflow with Taxiway's DAGs, plugins and pipeline code baked in (api-server, scheduler, dag-processor,
# Celery workers, triggerer). Build from the repo root:
#   docker build -f docker/airflow.Dockerfile -t taxiway-airflow:<git-sha> .
# Pinned by tag here; pin by digest at build time for bit-identical rebuilds (docker/README.md).
FROM apache/airflow:3.3.2-python3.11

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
RUN pip install --no-cache-dir --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --no-cache-dir -c /opt/taxiway/requirements/constraints.txt \
        apache-airflow==3.3.2 \
        apache-airflow-providers-cncf-kubernetes==10.25.0 \
        apache-airflow-providers-celery==3.26.0 \
        /opt/taxiway

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/taxiway/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/taxiway/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    TAXIWAY_CONFIG=/opt/taxiway/configs/base.yaml
