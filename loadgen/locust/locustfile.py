"""Locust load test for stallfree-serve or any OpenAI-compatible completions server (README: "Exploring with the Locust web UI"):

    locust -f loadgen/locust/locustfile.py --host http://127.0.0.1:8000 OpenLoopUser --qps 4 --workload arxiv

Every streamed completion is one Locust request of type "LLM" named after --endpoint ("completions" or
"chat"), its response time the E2E latency from the intended send time; failures (HTTP errors, timeouts,
aborted) count as failures, and open-loop arrivals dropped at --max-in-flight as failures under
"dropped". Requests still in flight when the test stops (-t, Stop) are "cancelled at stop": no Locust
request and no failure (the exit code is unaffected), counted in the LLM statistics' cancelled_at_stop.
Locust's CSVs, its HTML report, its stdout summary and PREFIX_llm.csv agree on every count. Token-level statistics (output tokens/s, TTFT / TBT percentiles, SLO attainment against
--slo / --slo-tbt-ms, requests in flight, late sends) go to the web UI's LLM tab and to --csv's
PREFIX_llm.csv (loadgen.locust.llm_tab), never to the request table; the whole run's end the stdout summary
and the --html report (loadgen.locust.end_summary).

Users (name one on the command line, or pick one with --class-picker in the web UI):
* LLMUser, closed loop: send a request, read the whole stream, wait --wait seconds, repeat.
* OpenLoopUser, open loop: the OpenLoopUsers of a process dispatch its Poisson schedule of absolute send
  times; each request runs in its own greenlet, so arrivals never wait for responses. One user per
  process is enough (more only add dispatcher greenlets, not load).
A session workload (--workload chat / agentic) sends each session's turns one after another, a follow-up its
think time after the turn before it ended (loadgen.locust.process_run): LLMUser runs one session at a time,
OpenLoopUser starts sessions at --qps.

Distributed (--master / --worker, or --processes): each of the W = --expect-workers processes runs
qps / W on its own seed (--seed, worker index), so together they offer --qps.

Requests come from the workloads of stallfree-bench (conf/workload/<--workload>.yaml through
loadgen.workload.request_specs), or from --specs-file (JSON lines of RequestSpec; worker i of W takes every W-th one
from the i-th): that is how target=locust replays a bench run. --num-requests or --specs-file bound the
run: it ends once every request is done. Otherwise it runs until stopped.

Raw records: with --rows-dir DIR every process appends one RequestRecord per request (epoch seconds at
full precision) as a JSON line to DIR/rows-<role><index>-<pid>.jsonl the moment the request ends;
loadgen.locust.target.read_records merges the files. Files rather than Locust messages: a record
is on disk whatever order master and workers stop in (one host, or a shared directory).

--step-users (closed loop) or --step-qps (open loop) with --step-seconds installs StepShape, a
LoadTestShape that steps the load through a list, for finding the knee by hand.

The schedule lives in loadgen.locust.schedule, a process's run of it in loadgen.locust.process_run, the request and
its Locust event in loadgen.locust.user_request.
"""
from __future__ import annotations

import sys
import time

import gevent
from locust import FastHttpUser, LoadTestShape, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

from stallfree.loadgen.locust.llm_events import LiveEvents
from stallfree.loadgen.locust.llm_stats import SLO_NAMES, slo_bounds
from stallfree.loadgen.locust.llm_tab import install as install_llm_tab
from stallfree.loadgen.locust.process_run import DONE_MESSAGE, ProcessRun
from stallfree.loadgen.locust.schedule import WORKLOADS, parse_numbers, request_lengths


@events.init_command_line_parser.add_listener
def _add_options(parser: LocustArgumentParser) -> None:
    add = parser.add_argument
    add("--workload", choices=WORKLOADS, default="fixed", help="request lengths: conf/workload/<name>.yaml")
    add("--prompt-len", type=int, default=0, help="fixed prompt length (with --max-tokens: fixed lengths, "
        "the other one from conf/workload/fixed.yaml); 0: from --workload")
    add("--max-tokens", type=int, default=0, help="fixed output length (see --prompt-len); 0: from --workload")
    add("--qps", type=float, default=1.0, help="OpenLoopUser: offered requests/s, all processes together")
    add("--seed", type=int, default=0, help="workload seed (each process adds its worker index)")
    add("--num-requests", type=int, default=0, help="requests of the whole run (0: until stopped)")
    add("--max-in-flight", type=int, default=0, help="OpenLoopUser: per-process cap; arrivals beyond it are "
        "dropped (0: no cap)")
    add("--wait", type=float, default=0.0, help="LLMUser: seconds between a response and the next request")
    add("--request-timeout", type=float, default=600.0, help="seconds for a whole streamed request")
    add("--endpoint", choices=("completions", "chat"), default="completions",
        help="/v1/completions or /v1/chat/completions (chat needs text: a text --workload or --specs-file)")
    add("--model", default="", help='the "model" field of each request (empty: left out)')
    add("--no-ignore-eos", action="store_true", help="leave vLLM's ignore_eos out of each request")
    add("--vocab-size", type=int, default=2048, help="prompt token ids are drawn below this")
    add("--step-users", default="", help="StepShape: comma-separated user counts, one per step")
    add("--step-qps", default="", help="StepShape: comma-separated OpenLoopUser rates, one per step")
    add("--step-seconds", type=float, default=30.0, help="StepShape: duration of each step")
    slo_help = "the LLM tab's SLO (command line only): "
    add("--slo", choices=SLO_NAMES, default="", include_in_web_ui=False,
        help=slo_help + "conf/slo/<name>.yaml (a multiple of --decode-iter-ms where it sets no tbt_ms)")
    add("--slo-tbt-ms", type=float, default=0.0, include_in_web_ui=False, help=slo_help + "TBT bound in ms")
    add("--slo-ttft-ms", type=float, default=0.0, include_in_web_ui=False, help=slo_help + "TTFT bound in ms")
    add("--decode-iter-ms", type=float, default=0.0, include_in_web_ui=False,
        help="decode-only iteration time for --slo's tbt_multiple (a bench run's summary.json decode_iter_ms)")
    add("--specs-file", default="", include_in_web_ui=False, help="replay these requests (JSON lines)")
    add("--rows-dir", default="", include_in_web_ui=False, help="write raw per-request rows here")


_run: ProcessRun | None = None  # the current test of this process (not on a master)
_live = LiveEvents()  # this process's requests, for the LLM tab
_done: set[int] = set()  # master / standalone: indexes of the processes whose requests have all ended


# ------------------------------------------------------------------------------------- users


class LLMUser(FastHttpUser):
    """Closed loop: one request (or one session, turn by turn) at a time, each read to its end, then --wait
    seconds."""

    def wait_time(self) -> float:
        return self.environment.parsed_options.wait

    @task
    def complete(self) -> None:
        group = _run.next_group()
        if group is None:
            raise StopUser
        _run.run_group(self.client, group, time.time())


class OpenLoopUser(FastHttpUser):
    """Open loop: dispatches this process's arrival schedule; responses never delay arrivals."""

    concurrency = 100_000  # connections of the shared session: no cap below --max-in-flight

    @task
    def dispatch(self) -> None:
        _run.start_clock()
        while (group := _run.next_group()) is not None:
            _run.dispatch(self.client, group)
        _run.open_groups.join()
        raise StopUser


class StepShape(LoadTestShape):
    """--step-users (user counts) or --step-qps (the open-loop schedule's rates; users stay at --users),
    each for --step-seconds; the test ends after the last step. Installed by _on_init only when a step
    list is given (``abstract``: Locust would otherwise use it for every run)."""

    abstract = True
    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        opts = self.runner.environment.parsed_options
        users = [int(u) for u in parse_numbers(opts.step_users, "--step-users")]
        step = int(self.get_run_time() // opts.step_seconds)
        if step >= len(users or parse_numbers(opts.step_qps, "--step-qps")):
            return None
        count = users[step] if users else opts.num_users
        return count, opts.spawn_rate or count


# ------------------------------------------------------------------------------------- wiring


def _on_done(environment: Environment, msg, **_) -> None:
    """A process has ended all of its requests; once every one has, the run is over."""
    _done.add(msg.data)
    runner = environment.runner
    if len(_done) >= (runner.worker_count if isinstance(runner, MasterRunner) else 1):
        gevent.spawn(_finish, environment)


def _finish(environment: Environment) -> None:
    """Stop the test; headless, quit once the workers' last stats have reached the master and Locust's
    CSV writer (which rewrites the files every CSV_STATS_INTERVAL_SEC, not at exit) has caught up."""
    runner = environment.runner
    runner.stop()
    if environment.parsed_options.headless:
        gevent.sleep((WORKER_REPORT_INTERVAL if isinstance(runner, MasterRunner) else 0.0)
                     + CSV_STATS_INTERVAL_SEC + 0.5)
        runner.quit()


@events.init.add_listener
def _on_init(environment: Environment, runner, **_) -> None:
    opts = environment.parsed_options
    if opts is None:  # Locust used as a library: no command line
        return
    try:
        request_lengths(opts)
        slo = slo_bounds(opts)
        steps = [parse_numbers(opts.step_users, "--step-users"), parse_numbers(opts.step_qps, "--step-qps")]
    except (ValueError, OSError) as e:
        sys.exit(f"locustfile: {e}")
    if all(steps) and len(steps[0]) != len(steps[1]):
        sys.exit("locustfile: --step-users and --step-qps need the same number of steps")
    install_llm_tab(environment, _live, slo)
    # gevent's loop time is cached since the loop last ran, before this locustfile's imports: refresh it,
    # or on a busy machine the -t timer Locust arms next starts seconds in the past and fires at once
    gevent.get_hub().loop.update_now()
    if opts.headless and opts.csv_prefix:  # let Locust's CSV writer catch up with the last requests at quit
        environment.events.quit.add_listener(lambda **_: gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2))
    if not isinstance(runner, WorkerRunner):
        runner.register_message(DONE_MESSAGE, _on_done)
        if any(steps):
            environment.shape_class = StepShape()
            environment.shape_class.runner = runner


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_) -> None:
    global _run
    _done.clear()
    if not isinstance(environment.runner, MasterRunner):
        _run = ProcessRun(environment, _live)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_) -> None:
    if _run is not None:
        _run.close()
