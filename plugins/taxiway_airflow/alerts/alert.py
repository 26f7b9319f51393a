"""What an alert says: the event, where (DAG and run ids), one line, and a link to the run in the
Training runs view. Built from names, counts and ids only: never a secret, never a value from the
environment, so it may go to any inbox or chat channel the deployment names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Literal
from urllib.parse import quote

from taxiway_airflow.links import ROUTE, airflow_base

Event = Literal["run_failed", "batch_quarantined", "champion_stale", "approval_waiting"]
MAX_SUMMARY = 500
MAX_SUBJECT = 150  # the whole summary is in the body; a subject only has to be told apart


def run_link(dag_id: str, run_id: str) -> str:
    """The run's page in the Training runs view (absolute once the deployment sets ``[api] base_url``)."""
    return f"{airflow_base()}{ROUTE}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def span(seconds: float) -> str:
    """A duration as people read it in an alert: hours under two days, else days."""
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} d"


def _one_line(text: str, limit: int = MAX_SUMMARY) -> str:
    line = " ".join(str(text).split())  # no line break can reach a mail header
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Alert:
    event: Event
    dag_id: str
    run_id: str
    summary: str
    at: str = field(default_factory=_now)  # UTC ISO 8601
    link: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", _one_line(self.summary))
        object.__setattr__(self, "link", run_link(self.dag_id, self.run_id))

    def headline(self) -> str:
        return f"[taxiway] {self.event.replace('_', ' ')}: {self.summary}"

    def subject(self) -> str:
        return _one_line(self.headline(), MAX_SUBJECT)

    def body(self) -> str:
        """The mail's text."""
        return (f"{self.summary}\n\nevent: {self.event}\nDAG: {self.dag_id}\nrun: {self.run_id}\nat: {self.at}\n"
                f"run in the Training runs view: {self.link}\n")

    def to_json(self) -> dict[str, str]:
        """The webhook's body; ``text`` is the one line a chat webhook (Slack, Mattermost) shows as is."""
        return {**asdict(self), "text": f"{self.headline()} {self.link}"}
