"""Hyperparameter sweeps: ``points`` (the ``sweep`` param checked against the RunConfig),
``members`` (one run folder per point, sharing the parent run's preflight and packed data),
``ranking`` (members ranked by val bits/byte) and ``registration`` (the MLflow parent run, one child
run per member, the best member registered). Callers import the modules they need."""
