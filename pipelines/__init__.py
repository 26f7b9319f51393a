"""Taxiway's config and execution stages: plain functions, callable from the CLI, tests and Airflow."""
