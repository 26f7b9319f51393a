# Airflow with Taxiway's DAGs, plugins and pipeline code baked in (scheduler, workers, api-server).
# Build from the repo root:  docker build -f docker/airflow.Dockerfile -t taxiway-airflow:<git-sha> .
FROM apache/airflow:3.3.2-python3.11

USER root
COPY --chown=airflow:0 . /opt/taxiway
USER airflow
RUN pip install --no-cache-dir -c /opt/taxiway/requirements/constraints.txt /opt/taxiway
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/taxiway/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/taxiway/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    TAXIWAY_CONFIG=/opt/taxiway/configs/base.yaml
