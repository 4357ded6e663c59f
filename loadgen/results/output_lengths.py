"""Output lengths as asked for and as served. Every request asks for exactly ``max_tokens`` (greedy, with
``ignore_eos`` where the target takes it); a server that ignores ``ignore_eos``, or is not sent it, ends
some at their end-of-sequence token. Such a run measures other requests than it asked for, so its
summary says how many ended early and by how much, and the run prints a warning, rather than
averaging short requests in silently."""
from __future__ import annotations

from collections.abc import Sequence

from stallfree.engine.records import RequestRecord

# upper bounds of the got / asked ratio of a request that ended early; a complete one is "100%"
RATIO_BINS = ((0.25, "<25%"), (0.5, "25-50%"), (0.75, "50-75%"), (1.0, "75-<100%"))
COMPLETE = "100%"


def _bin(got: int, asked: int) -> str:
    ratio = got / asked
    return next((name for bound, name in RATIO_BINS if ratio < bound), COMPLETE)


def output_length_summary(records: Sequence[RequestRecord]) -> dict:
    """Of the measured requests that completed: ``early_stop_fraction`` (ended before max_tokens; None
    without any), the tokens asked for and got, and ``output_length_histogram`` (requests per got / asked
    ratio bin)."""
    done = [r for r in records if r.status == "ok" and not r.is_warmup]
    histogram = dict.fromkeys([name for _, name in RATIO_BINS] + [COMPLETE], 0)
    for record in done:
        histogram[_bin(record.output_tokens, record.max_tokens)] += 1
    early = len(done) - histogram[COMPLETE]
    return {"early_stop_fraction": early / len(done) if done else None,
            "requested_output_tokens": sum(r.max_tokens for r in done),
            "served_output_tokens": sum(r.output_tokens for r in done),
            "output_length_histogram": histogram}


def early_stop_warning(summary: dict) -> str | None:
    """One line when requests ended before max_tokens, naming what was sent; None otherwise."""
    fraction = summary.get("early_stop_fraction")
    if not fraction:
        return None
    why = ("the server ignored ignore_eos" if summary.get("ignore_eos")
           else "ignore_eos was not sent (target.ignore_eos), so requests end at EOS")
    return (f"warning: {fraction:.0%} of the completed requests ended before max_tokens "
            f"({summary['served_output_tokens']} of {summary['requested_output_tokens']} tokens asked for; {why}): "
            "latencies and throughput are of shorter requests than the workload's")
