"""Server-rendered HTML of the "Training runs" view: the table of runs and a run's page.

No JavaScript and no build step: plots are inline SVG; every value from a file or the database is
escaped. Links to Airflow pages leave the iframe the Airflow UI shows the view in (``_top``);
links to MLflow open a new tab.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from pipelines.refresh.batches import BatchRow, Listing
from pipelines.run_folder import taxiway_home
from taxiway_airflow.runs_view.approvals import Approval
from taxiway_airflow.runs_view.folder import RunFiles

STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1f2933}
table{border-collapse:collapse;width:100%;font-size:14px}
th,td{border-bottom:1px solid #e4e7eb;padding:6px 8px;text-align:left;vertical-align:middle}
th{background:#f5f7fa}
.bar{width:120px;height:10px;background:#e4e7eb;border-radius:5px;display:inline-block;vertical-align:middle}
.bar>span{display:block;height:100%;background:#3e7bfa;border-radius:5px}
.state{padding:2px 6px;border-radius:4px;font-size:12px;background:#e4e7eb}
.state-success,.state-passed,.state-succeeded{background:#c6f7d2}
.state-failed{background:#ffd2d2}
.state-running,.state-queued{background:#d6e4ff}
.muted{color:#7b8794}
pre{background:#f5f7fa;padding:8px;white-space:pre-wrap}
.why{color:#cf1124;font-size:12px}
.failure{border-left:4px solid #e12d39;background:#fff5f5;padding:8px 12px;margin:12px 0}
.state-trained{background:#c6f7d2}
.state-new{background:#d6e4ff}
.state-invalid,.state-quarantined,.state-changed{background:#ffd2d2}
.state-re-sent{background:#fff3c4}
.done{border-left:4px solid #3ebd93;background:#effcf6;padding:8px 12px;margin:12px 0}
nav{margin-bottom:8px}
.nowrap{white-space:nowrap}
"""


@dataclass(frozen=True)
class RunRow:
    """An Airflow run of a Taxiway DAG and what its run folder says."""

    dag_id: str
    run_id: str
    state: str
    started: datetime | None
    note: str | None
    files: RunFiles


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "–"


def _badge(state: str | None) -> str:
    if not state:
        return "<span class='muted'>–</span>"
    return f"<span class='state state-{escape(state)}'>{escape(state)}</span>"


def sparkline(points: list[tuple[int, float]], width: int = 120, height: int = 28) -> str:
    """The loss as an inline SVG polyline (empty before two points exist)."""
    if len(points) < 2:
        return "<span class='muted'>–</span>"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx, sy = width / ((x1 - x0) or 1), (height - 4) / ((y1 - y0) or 1)
    path = " ".join(f"{(x - x0) * sx:.1f},{height - 2 - (y - y0) * sy:.1f}" for x, y in points)
    return (f"<svg class='sparkline' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>"
            f"<polyline fill='none' stroke='#3e7bfa' stroke-width='1.5' points='{path}'/></svg>")


def loss_curve(points: list[tuple[int, float]]) -> str:
    """A larger curve with axis labels for a run's page."""
    if len(points) < 2:
        return "<p class='muted'>No loss logged yet.</p>"
    (first_step, _), (last_step, _) = points[0], points[-1]
    lo, hi = min(p[1] for p in points), max(p[1] for p in points)
    return (f"<figure>{sparkline(points, 640, 220)}<figcaption class='muted'>loss from {hi:.3f} to {lo:.3f} "
            f"over steps {first_step}–{last_step}</figcaption></figure>")


def _progress(files: RunFiles) -> str:
    share, status = files.progress, files.status
    if share is None:
        return "<span class='muted'>–</span>"
    return (f"<span class='bar' title='{share:.0%}'><span style='width:{share * 100:.1f}%'></span></span> "
            f"{status['step']}/{status['total_steps']}")


def _checkpoint(files: RunFiles) -> str:
    path = files.status.get("last_checkpoint")
    return escape(str(path).rstrip("/").rsplit("/", 1)[-1]) if path else "–"


def run_links(row: RunRow, root: str) -> str:
    """Airflow run, MLflow run, model version (those that exist yet)."""
    dag, run = quote(row.dag_id, safe=""), quote(row.run_id, safe="")
    out = [f"<a target='_top' href='/dags/{dag}/runs/{run}'>Airflow run</a>"]
    if row.files.losses or row.files.registry:
        out.append(f"<a target='_blank' href='{root}/go/mlflow-run/{dag}/{run}'>MLflow run</a>")
    if row.files.ranking:
        out.append(f"<a href='{root}/go/sweep-ranking/{dag}/{run}'>Sweep ranking</a>")
    if row.files.registry.get("version"):
        reg = row.files.registry
        out.append(f"<a target='_blank' href='{root}/go/model-version/{dag}/{run}'>"
                   f"{escape(str(reg.get('model_name')))} v{escape(str(reg['version']))}</a>")
    return " · ".join(out)


def _why(row: RunRow) -> str:
    """A failed run's one line: the failure summary, else the first line of the run's note."""
    if row.state != "failed":
        return ""
    failure = row.files.failure
    text = (f"failed at {failure.get('stage')}: {failure.get('reason')}" if failure
            else (row.note or "").strip().splitlines()[0].replace("**", "") if row.note else "")
    return f"<br><span class='why'>{escape(text[:160])}</span>" if text else ""


def _waited(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 1440} d {minutes // 60 % 24} h" if minutes >= 1440 else f"{minutes // 60} h {minutes % 60} min"


def approvals_table(approvals: list[Approval]) -> str:
    """Approvals waiting for a person, each linked to Airflow's page where it is answered."""
    if not approvals:
        return "<p class='muted'>No approval is waiting.</p>"
    rows = "".join(
        f"<tr class='approval' data-run-id='{escape(a.run_id)}'><td>{escape(a.run_id)}<br><span class='muted'>"
        f"{escape(a.dag_id)}</span></td><td>{escape(a.subject)}</td><td>{escape(a.version or '–')}</td>"
        f"<td>{_waited(a.waited_s())}</td><td><a target='_top' href='{escape(a.link)}'>Approve or reject</a></td></tr>"
        for a in approvals)
    return (f"<table><tr><th>run</th><th>asks</th><th>model version</th><th>waiting for</th><th></th></tr>"
            f"{rows}</table>")


def runs_table(rows: list[RunRow], root: str, approvals: list[Approval] | None = None) -> str:
    head = ("<tr><th>run</th><th>state</th><th>training</th><th>step</th><th>loss</th><th>curve</th>"
            "<th>tokens/s</th><th>restarts</th><th>last checkpoint</th><th>eval</th><th>links</th></tr>")
    body = []
    for row in rows:
        f, st = row.files, row.files.status
        page = f"{root}/runs/{quote(row.dag_id, safe='')}/{quote(row.run_id, safe='')}"
        started = row.started.strftime("%Y-%m-%d %H:%M") if row.started else ""
        body.append(
            f"<tr class='run' data-run-id='{escape(row.run_id)}'>"
            f"<td><a href='{page}'>{escape(row.run_id)}</a><br><span class='muted'>{escape(row.dag_id)} "
            f"{started}</span>{_why(row)}</td><td>{_badge(row.state)}</td><td>{_badge(st.get('state'))}</td>"
            f"<td>{_progress(f)}</td><td>{_num(st.get('loss'), '.4f')}</td><td>{sparkline(f.losses)}</td>"
            f"<td>{_num(st.get('tokens_per_s'), ',.0f')}</td><td>{_num(st.get('restarts'), 'd')}</td>"
            f"<td>{_checkpoint(f)}</td><td>{_badge(f.decision)}</td><td>{run_links(row, root)}</td></tr>")
    empty = "" if rows else "<p class='muted'>No taxiway_train, taxiway_refresh or taxiway_sweep run yet.</p>"
    waiting = (f"<h2>Waiting for approval</h2>{approvals_table(approvals)}<h2>Runs</h2>"
               if approvals is not None else "")
    return _page("Training runs", f"<nav><a href='{root}/batches'>Landed batches →</a></nav><h1>Training runs</h1>"
                 f"{waiting}<table>{head}{''.join(body)}</table>{empty}")


def _size(count: int | None) -> str:
    if count is None:
        return "–"
    value, unit = float(count), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"


def _attempts(row: BatchRow) -> str:
    if not row.attempts:
        return ""
    failure = row.last_failure or {}
    last = (f"<br><span class='why'>last: failed at {escape(failure['stage'])}: {escape(failure.get('reason', '')[:200])}"
            f"</span>" if failure.get("stage") else "")
    return f"<br><span class='muted'>attempts: {escape(', '.join(row.attempts))}</span>{last}"


def _releases(row: BatchRow) -> str:
    return "".join(f"<br><span class='muted'>released by {escape(str(r.get('by')))} at {escape(str(r.get('at')))} "
                   f"({len(r.get('attempts', []))} attempt(s) cleared)</span>" for r in row.releases[-3:])


def batches_page(listing: Listing, root: str, done: str | None = None) -> str:
    """Every landed batch with its state; a quarantined one with a form that releases it."""
    if listing.landing is None:
        return _page("Landed batches", f"<p><a href='{root}/runs'>← Training runs</a></p><h1>Landed batches</h1>"
                     "<p class='muted'>refresh.landing is not set in the deployment's config: no landing zone.</p>")
    rows = []
    for b in listing.batches:
        action = (f"<form method='post' action='{root}/batches/{quote(b.id, safe='')}/release'>"
                  f"<button type='submit'>Release</button></form>" if b.state == "quarantined" else "")
        rows.append(
            f"<tr class='batch' data-batch-id='{escape(b.id)}'><td class='nowrap'>{escape(b.id)}</td><td>{_badge(b.state)}</td>"
            f"<td>{escape(_home_relative(b.reason)[:400])}{_attempts(b)}{_releases(b)}</td>"
            f"<td>{escape(b.trained_by or '')}</td><td>{_num(b.files, 'd')}</td><td class='nowrap'>{_size(b.bytes)}</td>"
            f"<td class='nowrap'>{escape(b.landed_at or '–')}</td><td>{action}</td></tr>")
    first = listing.page * listing.limit
    shown = (f"{first + 1}–{first + len(listing.batches)} of {listing.total} ({listing.limit} a page)"
             if listing.total > len(listing.batches) else f"all {listing.total}")
    pages = "".join(f" <a href='{root}/batches?page={n}'>{label}</a>" for n, label in (
        (listing.page - 1, "← newer"), (listing.page + 1, "older →"))
        if 0 <= n and n * listing.limit < listing.total)
    facts = (f"<p class='muted'>Landing zone {escape(_home_relative(listing.landing))} · champion "
             f"{escape(listing.champion or 'none')} · refresh.max_attempts {listing.max_attempts} · showing {shown}, "
             f"newest first{pages}</p>")
    head = ("<tr><th>batch</th><th>state</th><th>why</th><th>trained by</th><th>files</th><th>size</th>"
            "<th>landed at (UTC)</th><th></th></tr>")
    note = f"<div class='done'>{escape(done)}</div>" if done else ""
    empty = "" if listing.batches else "<p class='muted'>No batch has landed yet.</p>"
    return _page("Landed batches", f"<p><a href='{root}/runs'>← Training runs</a></p><h1>Landed batches</h1>"
                 f"{note}{facts}<table>{head}{''.join(rows)}</table>{empty}")


def _failure(failure: dict[str, Any]) -> str:
    if not failure:
        return ""
    return (f"<div class='failure'><b>Failed at {escape(str(failure.get('stage', '?')))}</b>: "
            f"{escape(str(failure.get('reason', '')))}<br>Next: {escape(str(failure.get('next', '')))}</div>")


def _preflight(report: dict[str, Any]) -> str:
    if not report:
        return "<p class='muted'>No preflight report yet.</p>"
    rows = "".join(f"<tr><td>{escape(name)}</td><td>{_badge('passed' if c.get('passed') else 'failed')}</td>"
                   f"<td>{escape(str(c.get('message', '')))}</td></tr>" for name, c in report.get("checks", {}).items())
    return f"<p>{_badge('passed' if report.get('passed') else 'failed')}</p><table>{rows}</table>"


def _evaluation(report: dict[str, Any], eval_link: str) -> str:
    if not report:
        return "<p class='muted'>Not evaluated yet.</p>"
    return (f"<p>{_badge('passed' if report.get('passed') else 'failed')} {escape(str(report.get('summary', '')))}</p>"
            f"<p>{escape(str(report.get('reason', '')))}</p><p><a href='{eval_link}'>Full report</a></p>")


def _home_relative(text: str) -> str:
    """Paths under the deployment's home as ``$TAXIWAY_HOME/…``: where the home lies on this machine
    says nothing to a reader, and a run folder's name stays readable in the space a page has."""
    return text.replace(str(taxiway_home()), "$TAXIWAY_HOME")


def _history(events: list[dict[str, Any]]) -> str:
    if not events:
        return "<p class='muted'>No trainer events yet.</p>"
    rows = "".join(
        f"<tr><td>{escape(str(e.get('time', '')))}</td><td>{escape(str(e.get('event', '')))}</td>"
        f"<td>{escape(str(e.get('level', '')))}</td><td class='muted'>"
        f"{escape(_home_relative(', '.join(f'{k}={v}' for k, v in e.items() if k not in ('time', 'event', 'level', 'rank')))[:300])}"
        f"</td></tr>" for e in reversed(events))
    return f"<table><tr><th>time</th><th>event</th><th>level</th><th>details</th></tr>{rows}</table>"


def run_page(row: RunRow, root: str) -> str:
    f, st = row.files, row.files.status
    dag, run = quote(row.dag_id, safe=""), quote(row.run_id, safe="")
    facts = (f"<p>{_badge(row.state)} training {_badge(st.get('state'))} {_progress(f)} · loss "
             f"{_num(st.get('loss'), '.4f')} · {_num(st.get('tokens_per_s'), ',.0f')} tokens/s · restarts "
             f"{_num(st.get('restarts'), 'd')} · last checkpoint {_checkpoint(f)}</p>")
    note = f"<p><b>Note:</b> {escape(row.note)}</p>" if row.note else ""
    body = (f"<p><a href='{root}/runs'>← Training runs</a></p><h1>{escape(row.run_id)}</h1>"
            f"<p class='muted'>{escape(row.dag_id)} · run folder {escape(_home_relative(str(f.folder)))}</p>"
            f"{_failure(f.failure)}{note}{facts}<p>{run_links(row, root)}</p>"
            f"<h2>Loss</h2>{loss_curve(f.losses)}<h2>Preflight</h2>{_preflight(f.preflight)}"
            f"<h2>Evaluation</h2>{_evaluation(f.evaluation, f'{root}/go/eval-report/{dag}/{run}')}"
            f"<h2>Status history</h2>{_history(f.events)}")
    return _page(f"{row.run_id} – Training runs", body)


def eval_report(row: RunRow, markdown: str, plot_url: str | None) -> str:
    plot = f"<img alt='per-unit comparison' src='{plot_url}' style='max-width:100%'>" if plot_url else ""
    return _page(f"Evaluation of {row.run_id}", f"<h1>Evaluation of {escape(row.run_id)}</h1>"
                 f"<pre>{escape(markdown)}</pre>{plot}")


def sweep_ranking(row: RunRow, markdown: str) -> str:
    return _page(f"Sweep ranking of {row.run_id}", f"<h1>Sweep ranking of {escape(row.run_id)}</h1>"
                 f"<pre>{escape(markdown)}</pre>")


def message(title: str, text: str) -> str:
    return _page(title, f"<h1>{escape(title)}</h1><p>{escape(text)}</p>")
