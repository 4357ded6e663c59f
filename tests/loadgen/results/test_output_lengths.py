"""Output lengths asked for vs served: early stops are counted, binned and warned about, not averaged in."""
import dataclasses

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.results.output_lengths import early_stop_warning, output_length_summary


def record(got: int, asked: int = 8, status: str = "ok", is_warmup: bool = False) -> RequestRecord:
    empty = RequestRecord.unsent(RequestSpec("r", 0.0, [1], asked), intended_send_time=0.0, is_warmup=is_warmup)
    return dataclasses.replace(empty, status=status, output_tokens=got)


def test_early_stops_are_binned_by_the_share_of_tokens_served():
    records = [record(8), record(8), record(1), record(2), record(5), record(7),
               record(3, status="error"), record(1, is_warmup=True)]  # neither counts
    summary = output_length_summary(records)
    assert summary["early_stop_fraction"] == 4 / 6
    assert summary["output_length_histogram"] == {"<25%": 1, "25-50%": 1, "50-75%": 1, "75-<100%": 1, "100%": 2}
    assert (summary["requested_output_tokens"], summary["served_output_tokens"]) == (48, 31)
    warning = early_stop_warning({**summary, "ignore_eos": True})
    assert warning.startswith("warning: 67% of the completed requests ended before max_tokens (31 of 48 tokens")
    assert "the server ignored ignore_eos" in warning
    assert "ignore_eos was not sent" in early_stop_warning({**summary, "ignore_eos": False})


def test_complete_outputs_and_no_completed_request_warn_of_nothing():
    assert early_stop_warning(output_length_summary([record(8)])) is None
    none = output_length_summary([record(0, status="error")])
    assert none["early_stop_fraction"] is None and early_stop_warning(none) is None
