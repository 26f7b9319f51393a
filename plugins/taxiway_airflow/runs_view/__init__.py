"""The "Training runs" view: a FastAPI app the Taxiway plugin mounts on the api-server under
``/taxiway``, behind Airflow's own auth. Imported by the api-server on the first request only."""
