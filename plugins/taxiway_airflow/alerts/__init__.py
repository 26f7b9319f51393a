"""Alerts the deployment configures (``alerts.*``, docs/alerts.md): one message per event, sent through
every Airflow connection the section names, by mail (SMTP) and as a JSON POST (webhook).

- ``alert``: what an alert says (``Alert``: event, DAG and run ids, one line, a link to the run).
- ``delivery``: sending one alert through each connection; a failure is logged, never raised.
- ``once``: the record that keeps an alert about the same thing from going out twice.
- ``notifier``: the Airflow notifier for a failed run (a DAG's ``on_failure_callback``).
- ``refresh``: what a refresh's plan alerts about (a newly quarantined batch, a stale champion) and the
  approval reminder.
"""
