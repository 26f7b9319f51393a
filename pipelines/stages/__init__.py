"""The stages of a run, one module each and each over a run folder (``RunFolder``): the only entry
the CLI, the Airflow tasks and the tests call (docs/architecture.md).

``prepare`` writes the run's ``config.yaml``; then ``preflight`` → ``tokenize`` → ``train`` →
``evaluate`` → ``register``. A sharded stage (preflight, tokenize) is ``plan`` → ``shard`` (one per
mapped Airflow task) → ``reduce``, and ``run`` does all three in one process; an unsharded one is
``run``. A refresh starts with ``refresh.plan`` and ``refresh.assemble``, and hands its
``RefreshPlan`` to tokenize, evaluate and register. ``parent`` is the registered model a run continues.
"""

from pipelines.stages import evaluate, parent, preflight, prepare, refresh, register, tokenize, train

__all__ = ["evaluate", "parent", "preflight", "prepare", "refresh", "register", "tokenize", "train"]
