"""The "Training runs" FastAPI app, mounted by the Taxiway plugin at ``/taxiway`` on the api-server.

Every route needs what the Airflow UI needs to see a DAG run (the ``_token`` cookie the UI's login
sets, or a bearer token): Airflow's own ``requires_access_dag`` dependency, so a request without a
valid token gets 401/403 like any REST call. The runs list (and the approvals waiting above it) only
shows DAGs the user may read. The batches page (``/batches``, ``/api/batches``) needs read access to
``taxiway_refresh``'s runs; releasing a quarantined batch (a form on the page, or
``POST /api/batches/{id}/release``) needs edit access to them, as clearing or marking a run does. The
form posts with the UI's cookie, which Airflow sets ``SameSite=Lax``: another site cannot post it.

The api-server's event loop must never wait on a run folder (shared storage can hang) or MLflow:
file, database and MLflow reads run in a small thread pool of their own, each request waits at most
``REQUEST_TIMEOUT_S`` (then 503, try again), and results are cached for ``CACHE_TTL_S``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

from airflow.api_fastapi.core_api.security import DagAccessEntity, GetUserDep, requires_access_dag
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import joinedload

from pipelines.config import RunConfig, load_config
from pipelines.errors import Transient
from pipelines.refresh import attempts, batches
from pipelines.run_folder import RunFolder, run_dir, run_key
from taxiway_airflow.params import default_config_path
from taxiway_airflow.runs_view import approvals, mlflow_ui, render
from taxiway_airflow.runs_view import folder as run_files

DAG_IDS = ("taxiway_train", "taxiway_refresh", "taxiway_sweep")
MAX_RUNS = 100            # newest runs listed
REQUEST_TIMEOUT_S = 8.0   # longest a request waits for files, the database or MLflow
CACHE_TTL_S = 5.0         # status.json is rewritten every few seconds: fresher would only cost reads

T = TypeVar("T")


class TtlCache:
    """Results by key for ``ttl_s`` seconds; concurrent misses of one key may both compute (harmless)."""

    def __init__(self, ttl_s: float, max_entries: int = 512) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._lock = threading.Lock()
        self._entries: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, compute: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            if hit and now - hit[0] < self.ttl_s:
                return hit[1]
        value = compute()
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (time.monotonic(), value)
        return value

    def drop(self, prefix: tuple[Any, ...]) -> None:
        """Forget every key that begins with ``prefix`` (a listing's every page): the next read computes
        it (after a write the page must show)."""
        with self._lock:
            for key in [k for k in self._entries if isinstance(k, tuple) and k[:len(prefix)] == prefix]:
                del self._entries[key]


Page = Annotated[int, Query(ge=0, le=100_000, description="Which page of the listing, newest first")]
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="taxiway-runs-view")
_cache = TtlCache(CACHE_TTL_S)


async def off_loop(key: Any, compute: Callable[[], T]) -> T:
    """``compute()`` (cached under ``key``) in the view's thread pool, waited for at most
    ``REQUEST_TIMEOUT_S``; a slow read keeps going in its thread and fills the cache for the next try."""
    return await in_pool(str(key[0]), lambda: _cache.get(key, compute))


async def in_pool(what: str, compute: Callable[[], T]) -> T:
    """``compute()`` in the view's thread pool, waited for at most ``REQUEST_TIMEOUT_S`` (then 503); a
    registry that cannot be reached is a 503 too."""
    future = asyncio.get_running_loop().run_in_executor(_pool, compute)
    try:
        return await asyncio.wait_for(asyncio.shield(future), REQUEST_TIMEOUT_S)
    except TimeoutError:
        raise HTTPException(503, f"reading {what} took longer than {REQUEST_TIMEOUT_S:.0f} s; try again") from None
    except Transient as exc:
        raise HTTPException(503, f"{what}: {exc}") from None


# --- reads (run in the pool) --------------------------------------------------------------------

def _airflow_runs(dag_ids: tuple[str, ...], run_id: str | None = None) -> list[tuple[str, str, str, Any, str | None]]:
    """(dag_id, run_id, state, start_date, note) of the newest runs of ``dag_ids``, newest first."""
    query = select(DagRun).options(joinedload(DagRun.dag_run_note)).where(DagRun.dag_id.in_(dag_ids))
    if run_id is not None:
        query = query.where(DagRun.run_id == run_id)
    with create_session() as session:
        runs = session.scalars(query.order_by(DagRun.run_after.desc()).limit(MAX_RUNS)).unique().all()
        return [(r.dag_id, r.run_id, str(r.state), r.start_date, r.note) for r in runs]


def _deployment() -> RunConfig:
    """The deployment's config (``TAXIWAY_CONFIG``): where batches land, the registry, the policy."""
    return load_config(default_config_path())


def _listing(page: int = 0) -> batches.Listing:
    return batches.listing(_deployment(), page=page)


def _folder(dag_id: str, run_id: str) -> Path:
    return run_dir(dag_id, run_id)


def _rows(dag_ids: tuple[str, ...], run_id: str | None = None, with_events: bool = False) -> list[render.RunRow]:
    return [render.RunRow(dag, run, state, started, note, run_files.read(_folder(dag, run), with_events))
            for dag, run, state, started, note in _airflow_runs(dag_ids, run_id)]


# --- routes -------------------------------------------------------------------------------------

def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


def _readable(user: Any) -> tuple[str, ...]:
    from airflow.api_fastapi.app import get_auth_manager  # the api-server loads this app while building its own

    allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    return tuple(d for d in DAG_IDS if d in allowed)


async def _one(dag_id: str, run_id: str, with_events: bool = False) -> render.RunRow:
    if dag_id not in DAG_IDS:
        raise HTTPException(404, f"{dag_id}: not a Taxiway training DAG ({', '.join(DAG_IDS)})")
    rows = await off_loop(("run", dag_id, run_id, with_events), lambda: _rows((dag_id,), run_id, with_events))
    if not rows:
        raise HTTPException(404, f"{dag_id} has no run {run_id!r}")
    return rows[0]


def create_app() -> FastAPI:
    app = FastAPI(title="Taxiway training runs", docs_url=None, redoc_url=None, openapi_url=None)
    dag_access = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]
    batches_read = [Depends(requires_access_dag("GET", DagAccessEntity.RUN, batches.REFRESH_DAG))]
    batches_edit = [Depends(requires_access_dag("PUT", DagAccessEntity.RUN, batches.REFRESH_DAG))]

    async def listed(user: Any) -> list[render.RunRow]:
        return await off_loop(("runs", user.get_id()), lambda: _rows(_readable(user)))

    async def waiting(user: Any) -> list[approvals.Approval]:
        return await off_loop(("approvals", user.get_id()), lambda: approvals.pending(_readable(user)))

    @app.get("/runs", response_class=HTMLResponse)
    async def runs(request: Request, user: GetUserDep) -> str:
        return render.runs_table(await listed(user), _root(request), await waiting(user))

    @app.get("/api/approvals")
    async def approvals_json(user: GetUserDep) -> JSONResponse:
        return JSONResponse([a.to_json() for a in await waiting(user)])

    @app.get("/batches", response_class=HTMLResponse, dependencies=batches_read)
    async def batches_html(request: Request, page: Page = 0) -> str:
        return render.batches_page(await off_loop(("batches", page), lambda: _listing(page)), _root(request))

    @app.get("/api/batches", dependencies=batches_read)
    async def batches_json(page: Page = 0) -> JSONResponse:
        return JSONResponse((await off_loop(("batches", page), lambda: _listing(page))).to_json())

    async def release(batch_id: str, user: Any) -> dict[str, Any]:
        """Release the batch as ``user``; 404 for an id the landing zone does not hold, 409 (naming its
        state) for a batch that is not quarantined. The id is only ever compared, never a path."""
        try:
            record = await in_pool("the landing zone", lambda: batches.release(_deployment(), batch_id, user.get_name()))
        except batches.UnknownBatch as exc:
            raise HTTPException(404, str(exc)) from None
        except attempts.NotQuarantined as exc:
            raise HTTPException(409, str(exc)) from None
        _cache.drop(("batches",))
        return record

    @app.post("/api/batches/{batch_id}/release", dependencies=batches_edit)
    async def release_json(batch_id: str, user: GetUserDep) -> JSONResponse:
        return JSONResponse({"batch": batch_id, **await release(batch_id, user)})

    @app.post("/batches/{batch_id}/release", response_class=HTMLResponse, dependencies=batches_edit)
    async def release_form(request: Request, batch_id: str, user: GetUserDep) -> HTMLResponse:
        try:
            record = await release(batch_id, user)
        except HTTPException as exc:
            if exc.status_code not in (404, 409):
                raise
            return HTMLResponse(render.message("Not released", str(exc.detail)), exc.status_code)
        done = (f"Released batch {batch_id}: {len(record['attempts'])} failed attempt(s) against {record['champion']} "
                f"cleared; the next refresh tries it again.")
        return HTMLResponse(render.batches_page(await off_loop(("batches", 0), _listing), _root(request), done))

    @app.get("/api/runs")
    async def runs_json(user: GetUserDep) -> JSONResponse:
        rows = await listed(user)
        return JSONResponse([{"dag_id": r.dag_id, "run_id": r.run_id, "state": r.state, "note": r.note,
                              "status": r.files.status, "decision": r.files.decision,
                              "registry": r.files.registry, "failure": r.files.failure,
                              "loss_points": len(r.files.losses)} for r in rows])

    @app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=dag_access)
    async def run_page(request: Request, dag_id: str, run_id: str) -> str:
        return render.run_page(await _one(dag_id, run_id, with_events=True), _root(request))

    @app.get("/runs/{dag_id}/{run_id}/comparison.png", dependencies=dag_access)
    async def comparison_plot(dag_id: str, run_id: str) -> FileResponse:
        path = RunFolder((await _one(dag_id, run_id)).files.folder).comparison_plot
        if not await off_loop(("exists", str(path)), path.exists):
            raise HTTPException(404, f"{path}: not written (the run was not evaluated)")
        return FileResponse(path, media_type="image/png")

    @app.get("/go/{target}/{dag_id}/{run_id}", dependencies=dag_access)
    async def go(request: Request, target: str, dag_id: str, run_id: str) -> Any:
        row = await _one(dag_id, run_id)
        if target == "mlflow-run":
            key = run_key(dag_id, run_id)
            found = await off_loop(("mlflow-run", dag_id, run_id), lambda: mlflow_ui.run_url(key, row.files.folder))
            if not found:
                return HTMLResponse(render.message("No MLflow run yet", f"{run_id} has not logged to MLflow yet "
                                                   "(training ships metrics once the gang runs)."), 404)
            return RedirectResponse(found)
        if target == "model-version":
            reg = row.files.registry
            if not reg.get("version"):
                return HTMLResponse(render.message("No model version", f"{run_id} registered no model (yet)."), 404)
            url = await off_loop(("model-version", dag_id, run_id), lambda: mlflow_ui.model_version_url(
                str(reg["model_name"]), str(reg["version"])))
            return RedirectResponse(url)
        if target == "eval-report":
            return await _eval_report(request, row)
        if target == "sweep-ranking":
            return await _sweep_ranking(row)
        raise HTTPException(404, f"{target}: no such link (mlflow-run, model-version, eval-report, sweep-ranking)")

    async def _sweep_ranking(row: render.RunRow) -> HTMLResponse:
        path = RunFolder(row.files.folder).sweep_ranking_summary
        markdown = await off_loop(("ranking", str(path)),
                                  lambda: path.read_text(errors="replace") if path.exists() else None)
        if markdown is None:
            return HTMLResponse(render.message("No sweep ranking", f"{path}: not written yet"), 404)
        return HTMLResponse(render.sweep_ranking(row, markdown))

    async def _eval_report(request: Request, row: render.RunRow) -> HTMLResponse:
        folder = RunFolder(row.files.folder)

        def read() -> tuple[str | None, bool]:
            md = folder.eval_summary.read_text(errors="replace") if folder.eval_summary.exists() else None
            return md, folder.comparison_plot.exists()

        markdown, has_plot = await off_loop(("eval", str(folder.root)), read)
        if markdown is None:
            return HTMLResponse(render.message("No eval report", f"{folder.eval_summary}: not written yet"), 404)
        page = f"{_root(request)}/runs/{quote(row.dag_id, safe='')}/{quote(row.run_id, safe='')}"
        plot = f"{page}/comparison.png" if has_plot else None
        return HTMLResponse(render.eval_report(row, markdown, plot))

    return app
