"""RequestRecord: the one row type of a run's requests (requests.parquet), whatever target sent them.

Every request a run sends ends as one record with a status: ok (the response completed), timeout,
aborted (cancelled in flight, or never sent: error "not sent") or error (the message is in ``error``).
Times are epoch seconds (the engine's clock for target=inprocess); ``server_*`` fields are the
server's own timings when it reports them, else None.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from stallfree.engine.records.request_spec import RequestSpec

NOT_SENT = "not sent"


def session_ended(failed: RequestRecord) -> str:
    """The error of a session's turn never sent because an earlier turn of it failed."""
    return f"{NOT_SENT}: turn {failed.turn} of its session ended {failed.status}"



@dataclass
class RequestRecord:
    request_id: str
    status: str  # ok | error | timeout | aborted
    error: str | None  # what went wrong (None when ok)
    is_warmup: bool  # sent before the measured window (left out of the metrics)
    prompt_tokens: int
    max_tokens: int
    output_tokens: int  # the server's count of a completed stream, else the tokens received
    intended_send_time: float  # the open-loop schedule's send time: latencies count from here
    send_time: float | None  # when the request was sent (None: never sent)
    first_token_time: float | None  # receive time of the first output token
    finish_time: float | None  # when the response ended (its last byte, or the failure)
    token_times: list[float] = field(default_factory=list)  # receive time of each output token
    server_arrival_time: float | None = None  # the server's own timings, when it reports them
    server_first_scheduled_time: float | None = None
    server_finish_time: float | None = None
    server_token_times: list[float] | None = None
    num_preemptions: int | None = None  # times the server preempted the request
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache, when it says
    # how long the request waited in the client for a slot under arrival.max_concurrency (None: no cap)
    client_wait_s: float | None = None
    session_id: str | None = None  # a turn of a multi-turn session (loadgen.workload.sessions), else None
    turn: int | None = None  # its place in the session
    session_end: str | None = None  # on a session's last turn: why the session ends there
    # its prompt's KV from a prefill instance to a decode instance (parallel.disaggregation; else None):
    kv_transfer_bytes: int | None = None
    kv_transfer_start: float | None = None  # the server's clock: when the decode instance began to receive it
    kv_transfer_end: float | None = None  # ... and when it had all of it

    @classmethod
    def unsent(cls, spec: RequestSpec, *, intended_send_time: float, is_warmup: bool) -> RequestRecord:
        """The record of a request that was never sent (status aborted, error "not sent")."""
        return cls(request_id=spec.request_id, status="aborted", error=NOT_SENT, is_warmup=is_warmup,
                   prompt_tokens=len(spec.prompt_token_ids), max_tokens=spec.max_tokens, output_tokens=0,
                   intended_send_time=intended_send_time, send_time=None, first_token_time=None,
                   finish_time=None, session_id=spec.session_id,
                   turn=spec.turn if spec.session_id is not None else None, session_end=spec.session_end)

    @classmethod
    def after_failed_turn(cls, spec: RequestSpec, failed: RequestRecord, *, intended_send_time: float,
                          is_warmup: bool) -> RequestRecord:
        """The record of a session's turn never sent because an earlier turn of it (``failed``) failed."""
        record = cls.unsent(spec, intended_send_time=intended_send_time, is_warmup=is_warmup)
        record.error = session_ended(failed)
        return record

    def mark_sent(self, send_time: float) -> None:
        self.send_time, self.error = send_time, None

    def end(self, status: str, error: str | None, finish_time: float) -> None:
        """Close a sent request: its status, when it ended, and its token counts.

        output_tokens keeps the server's final count (usage.completion_tokens) of a successful
        stream; otherwise it is the number of tokens received.
        """
        self.status, self.error, self.finish_time = status, error, finish_time
        if self.token_times:
            self.first_token_time = self.token_times[0]
        if status != "ok" or self.output_tokens == 0:
            self.output_tokens = len(self.token_times)
