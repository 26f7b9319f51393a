"""Airflow task callables, one module per DAG (``train``: the stages every training DAG shares;
``refresh``, ``land``, ``sweep``) plus ``kubernetes`` (the gang's Service setup and teardown) and
``common`` (what every task module uses). Each task is a thin wrapper around a ``pipelines.stages``
module: tasks pass only the run folder through XCom; each stage reads ``config.yaml`` from it."""
