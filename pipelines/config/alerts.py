"""``alerts``: where the deployment's alerts go (docs/alerts.md).

The section names Airflow connections only. Their hosts, logins and passwords live in the connection
(from the deployment's Secret backend), never here: a config file is read by anyone who reads the
repo or a run folder, and a trigger never sets this section (``pipelines.config.trust``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipelines.config.base import Section

CONN_ID = r"^[A-Za-z0-9_.-]{1,250}$"  # an Airflow connection id (as its UI and the env-var backend accept)
ConnId = Annotated[str, Field(pattern=CONN_ID, max_length=250)]
Mailbox = Annotated[str, Field(pattern=r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+$", max_length=254)]
MAX_CONNECTIONS = 8  # of each kind: every alert is sent to every one, one after the other


class AlertsConfig(Section):
    """Who is told, through which Airflow connections, when a refresh fails, a batch is quarantined,
    the champion goes stale while batches wait, or an approval waits past its reminder."""

    email: list[ConnId] = Field(
        [], max_length=MAX_CONNECTIONS,
        description="Airflow connections (type smtp or email) each alert is mailed through: host, port, login, "
                    "password; extra: from_email, to, disable_ssl, disable_tls (as the SMTP provider reads them)")
    email_to: list[Mailbox] = Field(
        [], max_length=64, description="Recipients of every alert mail, besides each connection's extra 'to'")
    webhooks: list[ConnId] = Field(
        [], max_length=MAX_CONNECTIONS,
        description="Airflow connections (type http) each alert is POSTed to as JSON: schema, host, port; the "
                    "path in extra 'endpoint'; the password, when set, as the Authorization header")
    timeout_s: float = Field(10.0, gt=0.0, le=60.0, description="Longest wait for one connection to take an alert")
