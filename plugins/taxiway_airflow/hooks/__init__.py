"""Hooks: calls to external systems the provider hooks do not offer (``kubernetes``: a gang's Jobs and pods;
``mlflow``: the MLflow tracking server's connection type)."""
