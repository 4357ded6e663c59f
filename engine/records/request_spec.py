"""RequestSpec: one request of a workload, as every target sends it."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# why a session ends after a turn (``session_end``): its turns are all sent, the next outgrew max_total_tokens,
# or the run's num_requests were reached
LAST_TURN, CONTEXT_LIMIT, REQUEST_LIMIT = "last_turn", "context_limit", "request_limit"


@dataclass
class RequestSpec:
    request_id: str
    send_offset_s: float  # seconds from the run start (a follow-up turn: its session's start)
    prompt_token_ids: list[int]
    max_tokens: int
    prompt: str | None = None  # text form (text workloads): HTTP targets send it instead of the ids
    messages: list[dict] | None = None  # chat messages (text workloads); prompt_token_ids is their rendering
    session_id: str | None = None  # a turn of a multi-turn session (loadgen.workload.sessions), else None
    turn: int = 0  # its place in the session; a later turn is sent think_time_s after the one before ends
    think_time_s: float = 0.0
    session_end: str | None = None  # on a session's last turn: why it ends there (LAST_TURN, ...)

    @property
    def follows(self) -> bool:
        """A follow-up turn: sent when the turn before it has ended, not at send_offset_s."""
        return self.session_id is not None and self.turn > 0


def session_groups(specs: Sequence[RequestSpec]) -> list[list[int]]:
    """The specs' indices grouped by session, in order: a follow-up turn joins the group before it (a session's
    turns are consecutive); every other request is a group of its own."""
    groups: list[list[int]] = []
    for i, spec in enumerate(specs):
        if spec.follows and groups and specs[groups[-1][-1]].session_id == spec.session_id:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
