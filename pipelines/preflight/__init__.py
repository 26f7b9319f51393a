"""The preflight checks' internals (docs/preflight.md): ``shards`` (plan and scan), ``reduce``
(judge the four checks), ``report`` (the gate's verdict), ``overlap``/``minhash``/``duplicates``
(near-duplicates across and within splits), ``manifest_check``, ``documents_check``
(Great Expectations), ``decontaminate``. The stage that runs them is ``pipelines.stages.preflight``."""
