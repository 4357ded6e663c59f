"""The LLM tab of the Locust web UI, and the flow of the token statistics behind it.

Every process records its requests' events in a LiveEvents (loadgen.locust.llm_events). A worker hands
them to the master with each stats report; the master, or a standalone process, aggregates them in an
LLMStats (loadgen.locust.llm_stats). The tab uses Locust's web-UI extension points for its React UI:
``extended_tabs`` / ``extended_tables`` / ``extended_csv_files`` in the web UI's template arguments, and
the rows as ``extended_stats`` added to every /stats/requests response (which the UI polls). With
--csv PREFIX the statistics of every window are also written to PREFIX_llm.csv when Locust quits, and
the whole run's statistics close Locust's stdout summary and its --html report (loadgen.locust.end_summary).
Imported only inside a Locust process.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable

import gevent
from flask import Response, request
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from locust.web import WebUI

from stallfree.loadgen.locust.end_summary import install as install_end_summary
from stallfree.loadgen.locust.llm_events import LiveEvents
from stallfree.loadgen.locust.llm_stats import LLMStats, SLOBounds, slo_label
from stallfree.loadgen.locust.server_stats import COLUMNS as SERVER_COLUMNS
from stallfree.loadgen.locust.server_stats import ServerUtilisation

TAB = "llm"
REPORT_KEY = "stallfree_llm"  # a worker's events in its stats report
LOCAL = "local"
DRAIN_INTERVAL_S = 1.0
CSV_PATH = "/llm_stats/csv"


def _columns(slo: SLOBounds) -> dict[str, str]:
    return {"name": "window from", "in_flight": "in flight", "cancelled_at_stop": "cancelled at stop",
            "requests_per_s": "ended/s",
            "output_tokens_per_s": "output tokens/s", "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p90_ms": "TTFT p90 (ms)",
            "ttft_p99_ms": "TTFT p99 (ms)", "tbt_p50_ms": "TBT p50 (ms)", "tbt_p90_ms": "TBT p90 (ms)",
            "tbt_p99_ms": "TBT p99 (ms)", "slo_met_pct": slo_label(slo),
            "late": "late sends", **SERVER_COLUMNS}


def install(environment: Environment, live: LiveEvents, slo: SLOBounds) -> None:
    """Wire this process: a worker reports ``live``; a master or standalone process aggregates, serves the
    tab (when it has a web UI) and writes the CSV at quit."""
    events = environment.events
    if isinstance(environment.runner, WorkerRunner):
        events.report_to_master.add_listener(lambda data, **_: data.update({REPORT_KEY: live.drain()}))
        return
    stats = LLMStats(slo)
    if isinstance(environment.runner, MasterRunner):
        def refresh() -> None:  # the workers' events come with their reports
            pass

        def on_worker_report(client_id: str, data: dict, **_) -> None:
            if REPORT_KEY in data:
                stats.ingest(client_id, data[REPORT_KEY])
        events.worker_report.add_listener(on_worker_report)
    else:
        def refresh() -> None:
            stats.ingest(LOCAL, live.drain())

        def drain_forever() -> None:  # bounds the events kept when nothing reads the statistics
            while True:
                refresh()
                gevent.sleep(DRAIN_INTERVAL_S)
        gevent.spawn(drain_forever)
    server = ServerUtilisation(environment.host or "", getattr(environment.parsed_options, "api_key", None))

    def restart(**_) -> None:
        now = time.time()
        stats.reset(now)
        server.reset(now)
    events.test_start.add_listener(restart)
    events.reset_stats.add_listener(restart)
    if environment.host:
        def poll_server() -> None:  # the engine's MFU / MBU per window (the target's /metrics)
            while True:
                server.poll()
                gevent.sleep(DRAIN_INTERVAL_S)
        gevent.spawn(poll_server)

    def write_csv(environment: Environment, **_) -> None:
        if prefix := environment.parsed_options.csv_prefix:
            refresh()
            with open(f"{prefix}_llm.csv", "w") as f:
                f.write(stats.csv_text())
    events.quitting.add_listener(write_csv)
    install_end_summary(environment, stats, refresh)
    if environment.web_ui is not None:
        _extend_web_ui(environment.web_ui, stats, refresh, environment.parsed_options.web_base_path, server)


def _extend_web_ui(web_ui: WebUI, stats: LLMStats, refresh: Callable[[], None], base_path: str,
                   server: ServerUtilisation) -> None:
    columns = _columns(stats.slo)
    web_ui.template_args.update({
        "extended_tabs": [{"title": "LLM", "key": TAB}],
        "extended_tables": [{"key": TAB, "structure": [{"key": k, "title": t} for k, t in columns.items()]}],
        "extended_csv_files": [{"href": f".{CSV_PATH}", "title": "Download LLM statistics CSV"}],
    })

    @web_ui.app.after_request
    def add_llm_rows(response: Response) -> Response:
        if request.path.endswith("/stats/requests") and response.is_json:
            refresh()
            rows = [{k: {**row, **server.columns(row["name"])}[k] for k in columns} for row in stats.rows()]
            response.set_data(json.dumps({**response.get_json(), "extended_stats": [{"key": TAB, "data": rows}]}))
        return response

    def llm_csv() -> Response:
        refresh()
        return Response(stats.csv_text(), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment; filename=llm_stats.csv"})
    web_ui.app.add_url_rule(f"{base_path or ''}{CSV_PATH}", "stallfree_llm_csv",
                            web_ui.auth_required_if_enabled(llm_csv))
