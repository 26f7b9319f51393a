"""Operators: the training gang as one task, on a local gang (``gang``) or on Kubernetes (``kubernetes``)."""
