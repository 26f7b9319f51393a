"""Document-level data expectations, run with Great Expectations (ephemeral context).

Every document becomes a row (split, doc id, bytes, characters, reading problem; made by the
shard scans, ``shards.py``); a suite
built from the config states what a usable corpus looks like. GE's own logging and progress
bars are silenced; its full validation result is kept in the report.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.report import CheckResult

_MAX_NAMED = 10


def _suite(cfg: RunConfig):
    import great_expectations as gx  # great_expectations (~3 s): DAG parse must not pay for it

    p = cfg.preflight
    suite = gx.ExpectationSuite(name="taxiway_documents")
    for exp in (
        gx.expectations.ExpectColumnValuesToBeNull(column="problem"),                  # UTF-8, not binary, text present
        gx.expectations.ExpectColumnValuesToNotBeNull(column="n_chars"),
        gx.expectations.ExpectColumnValuesToBeBetween(column="n_chars", min_value=p.min_chars, max_value=p.max_chars),
        gx.expectations.ExpectColumnValuesToBeUnique(column="doc_id"),
        gx.expectations.ExpectColumnDistinctValuesToContainSet(column="split", value_set=list(manifest.SPLITS)),
    ):
        suite.add_expectation(exp)
    return suite


def quiet_ge() -> None:
    """Import GE and quiet the loggers it sets up on import (also a Celery worker's preload:
    taxiway_airflow.celery_config)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations  # great_expectations (~3 s): importing it is this function's point  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("great_expectations"):
            logging.getLogger(name).setLevel(logging.ERROR)


def warm(cfg: RunConfig) -> None:
    """Import GE and run its lazy first-use setup on one row: that, not validating the corpus's
    rows, is most of the check's time, so the stage does it in a process of its own while the
    shards are scanned."""
    validate([{"split": "train", "doc_id": "warm", "n_bytes": 1, "n_chars": 1, "problem": None}], cfg)


def validate(rows: list[dict[str, Any]], cfg: RunConfig) -> dict[str, Any]:
    """GE validation result as a JSON-able dict."""
    quiet_ge()
    import great_expectations as gx  # great_expectations (~3 s): DAG parse must not pay for it
    import pandas as pd  # pandas (~0.25 s): DAG parse must not pay for it
    from great_expectations.data_context.types.base import ProgressBarsConfig  # GE (~3 s): DAG parse must not pay

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    frame = pd.DataFrame(rows, columns=["split", "doc_id", "n_bytes", "n_chars", "problem"])
    batch = (ctx.data_sources.add_pandas("taxiway").add_dataframe_asset("documents")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    result = batch.validate(_suite(cfg), result_format={"result_format": "COMPLETE",
                                                         "unexpected_index_column_names": ["doc_id"]})
    return result.to_json_dict()


def _failures(result: dict[str, Any], counts: dict[str, int]) -> list[str]:
    out = []
    for r in result["results"]:
        if r["success"]:
            continue
        cfg = r["expectation_config"]
        column = cfg["kwargs"].get("column")
        res = r.get("result", {})
        rows = res.get("unexpected_index_list") or []   # each row: doc_id and the offending column's value
        if cfg["type"] == "expect_column_distinct_values_to_contain_set":
            named = [f"split(s) with no documents: {[s for s, n in counts.items() if n == 0]}"]
        elif column == "doc_id":
            named = [str(row["doc_id"]) for row in rows]
        else:
            named = [f"{row['doc_id']} ({column}={row.get(column)})" for row in rows]
        more = f" and {len(named) - _MAX_NAMED} more" if len(named) > _MAX_NAMED else ""
        out.append(f"{cfg['type']}({column}): {', '.join(named[:_MAX_NAMED])}{more}")
    return out


def check_documents(cfg: RunConfig, rows: list[dict[str, Any]]) -> CheckResult:
    """``rows``: one per document of both splits, in file order, as the shard scans made them."""
    result = validate(rows, cfg)
    counts = {s: sum(r["split"] == s for r in rows) for s in manifest.SPLITS}
    failures = _failures(result, counts)
    message = (f"{len(rows)} documents meet {len(result['results'])} expectations "
               f"(train: {counts['train']}, val: {counts['val']})" if not failures
               else f"{len(failures)} expectation(s) failed: " + "; ".join(failures))
    stats = result.get("statistics", {})
    return CheckResult("documents", bool(result["success"]), message,
                       {"counts": counts, "failures": failures, "statistics": stats,
                        "great_expectations": _compact(result)})


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    """The GE result without per-row lists (those can be as long as the corpus)."""
    keep = ("observed_value", "element_count", "unexpected_count", "unexpected_percent", "partial_unexpected_list")
    return {"success": result["success"], "statistics": result.get("statistics"),
            "results": [{"type": r["expectation_config"]["type"], "kwargs": r["expectation_config"]["kwargs"],
                         "success": r["success"], "result": {k: r["result"].get(k) for k in keep if k in r["result"]}}
                        for r in result["results"]]}
