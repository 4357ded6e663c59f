"""What a run prints at its end, in the layout of vLLM's ``bench serve`` result block (request and token
throughput; TTFT, TPOT, ITL and E2EL mean, median and P99), and the one table a sweep prints at its end."""
from __future__ import annotations

WIDTH = 50
LATENCIES = (("ttft", "Time to First Token", "TTFT"), ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
             ("itl", "Inter-token Latency", "ITL"), ("e2el", "End-to-end Latency", "E2EL"))


def _line(label: str, value, spec: str = ".2f") -> str:
    text = "-" if value is None else format(value, spec)
    return f"{label:<40}{text}"


def result_block(summary: dict) -> str:
    """The run's summary as vLLM's result block (latencies from the intended send time)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=WIDTH, c="="),
             _line("Successful requests:", summary["completed"], "d"),
             _line("Failed requests:", summary["failed"], "d"),
             _line("Benchmark duration (s):", summary["duration"]),
             _line("Total input tokens:", summary["total_input_tokens"], "d"),
             _line("Total generated tokens:", summary["total_output_tokens"], "d"),
             _line("Request throughput (req/s):", summary["request_throughput"]),
             _line("Output token throughput (tok/s):", summary["output_throughput"]),
             _line("Total Token throughput (tok/s):", summary["total_token_throughput"])]
    for key, title, short in LATENCIES:
        lines.append("{s:{c}^{n}}".format(s=title, n=WIDTH, c="-"))
        lines += [_line(f"{stat.capitalize()} {short} (ms):", summary.get(f"{stat}_{key}_ms"))
                  for stat in ("mean", "median", "p99")]
    lines.append("=" * WIDTH)
    return "\n".join(lines)


SWEEP_COLUMNS = (("scheduler", "policy", "s"), ("chunk_size", "chunk", "s"), ("qps", "qps", "g"),
                 ("completed", "ok", "d"), ("failed", "failed", "d"), ("request_throughput", "req/s", ".2f"),
                 ("output_throughput", "tok/s", ".1f"), ("median_ttft_ms", "TTFT p50", ".1f"),
                 ("p99_ttft_ms", "TTFT p99", ".1f"), ("median_tpot_ms", "TPOT p50", ".1f"),
                 ("p99_itl_ms", "ITL p99", ".1f"), ("median_e2el_ms", "E2EL p50", ".1f"))


def sweep_table(summaries: list[dict]) -> str:
    """One row per run of a sweep: the result block's headline figures side by side."""
    def cell(summary: dict, key: str, spec: str) -> str:
        value = summary.get(key)
        return "-" if value is None else format(value, spec) if spec != "s" else str(value)

    rows = [[title for _, title, _ in SWEEP_COLUMNS],
            *([cell(s, key, spec) for key, _, spec in SWEEP_COLUMNS] + (["disturbed"] if s.get("disturbed") else [])
              for s in summaries)]
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(SWEEP_COLUMNS))]
    return "\n".join("  ".join(value.rjust(width) for value, width in zip(row, widths, strict=False)).rstrip()
                     + ("  disturbed" if len(row) > len(widths) else "") for row in rows)
