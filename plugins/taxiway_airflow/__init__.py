"""Airflow glue for Taxiway: trigger-form Params and the task callables the DAGs wire.

Lives in the Airflow plugins folder (on ``sys.path`` for the DAG processor and workers).
Only light imports at module level: the DAG processor parses DAG files under a time budget.
"""
