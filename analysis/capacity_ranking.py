"""Capacities and their ranking, as the report's conclusion (analysis.conclusion) writes them: a capacity is a
claim the runs must support, exact, a lower bound (">= X": it passed at the highest QPS tried) or below the
lowest QPS tried; a ratio takes the same qualifier, and none is given where the order is not established."""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.records.repeat_stats import mean_interval

EXACT, LOWER, BELOW = "exact", "lower", "below"  # Capacity.bound


@dataclass(frozen=True)
class Capacity:
    """One config's capacity under one SLO, and what the runs say about it."""
    config: str
    scheduler: str
    qps: float  # the capacity (mean over repeats); 0.0 when none passed
    bound: str  # EXACT; LOWER: passed at the highest QPS tried (>= qps); BELOW: none passed (< min_qps)
    min_qps: float  # the lowest QPS tried
    repeats: tuple[float, ...] = ()  # one capacity per repeat (seed); () when unknown
    disturbed_runs: tuple[str, ...] = ()

    @property
    def interval(self) -> tuple[float, float] | None:
        """95% interval of the mean over the repeats; None with fewer than two."""
        if len(self.repeats) < 2:
            return None
        spread = mean_interval(self.repeats)
        return spread.lo, spread.hi

    @property
    def rank_value(self) -> float:
        return 0.0 if self.bound == BELOW else self.qps

    def text(self) -> str:
        if self.bound == BELOW:
            return f"< {self.min_qps:g} QPS (none passed)"
        text = f"{'≥ ' if self.bound == LOWER else ''}{self.qps:.3g} QPS"
        if self.interval is not None:
            text += f" (95% interval {self.interval[0]:.3g}–{self.interval[1]:.3g} over {len(self.repeats)} repeats)"
        return text


def ratio_text(top: Capacity, other: Capacity) -> str | None:
    """``top`` over ``other`` as the runs support it ("2.0x", "≥ 2.0x", "> 4.0x"); None where the order of
    the two is not established (``other`` is a lower bound at or above ``top``, or neither passed)."""
    if top.bound == BELOW:
        return None
    if other.bound == BELOW:  # other < its lowest QPS: the ratio is above top / that QPS
        return f"> {top.qps / other.min_qps:.2f}x"
    if other.bound == LOWER:
        return None
    return f"{'≥ ' if top.bound == LOWER else ''}{top.qps / other.qps:.2f}x"


def spread_text(top: Capacity, other: Capacity) -> str:
    """Whether the difference of two capacities is larger than the spread between their repeats."""
    if top.interval is None or other.interval is None:
        single = [c.config for c in (top, other) if c.interval is None]
        return f"with one repeat of {' and '.join(single)} the run-to-run spread is unknown"
    if top.interval[0] > other.interval[1]:
        return "the difference is larger than the spread between repeats (the 95% intervals do not overlap)"
    return "the difference is not larger than the spread between repeats (the 95% intervals overlap)"


def policy_order(capacities: list[Capacity]) -> list[str]:
    """Policies by their best config's capacity, highest first."""
    ranked = sorted(capacities, key=lambda c: -c.rank_value)
    return list(dict.fromkeys(c.scheduler for c in ranked))


def best_per_policy(capacities: list[Capacity]) -> list[Capacity]:
    """Each policy's best config, highest first."""
    ranked = sorted(capacities, key=lambda c: -c.rank_value)
    return [next(c for c in ranked if c.scheduler == policy) for policy in policy_order(capacities)]


def comparison(capacities: list[Capacity], mark: str = "") -> str:
    """The ranking of the configs and the leading policy against each other one, as markdown sentences;
    ``mark`` follows every ratio (a reduced study's caveat)."""
    ranked = sorted(capacities, key=lambda c: -c.rank_value)
    lines = ["Ranking: " + "; ".join(f"{c.config} {c.text()}" for c in ranked) + "."]
    top, *others = best_per_policy(capacities)
    if top.bound == BELOW:
        return lines[0] + " No config passed at any QPS tried."
    ahead = []
    for other in others:
        ratio = ratio_text(top, other)
        if ratio is None:
            lines.append(f"{other.config}'s capacity is a lower bound ({other.text()}): its order against "
                         f"{top.config} is not established.")
        elif top.rank_value == other.rank_value and top.bound == other.bound == EXACT:
            lines.append(f"{top.scheduler} and {other.scheduler} have the same capacity ({top.text()}).")
        else:
            ahead.append(f"{top.config} reaches {ratio}{mark} {other.config}'s capacity; {spread_text(top, other)}")
    if ahead:
        lines.insert(1, f"**{top.scheduler} has the highest capacity**: " + ". ".join(ahead) + ".")
    return " ".join(lines)


def policy_ranking(capacities: list[Capacity]) -> str:
    """``sarathi > vllm`` (``=`` between policies whose best capacities are the same)."""
    best = best_per_policy(capacities)
    text = best[0].scheduler
    for ahead, behind in zip(best, best[1:], strict=False):
        same = (ahead.rank_value, ahead.bound) == (behind.rank_value, behind.bound)
        text += f" {'=' if same else '>'} {behind.scheduler}"
    return text


def disturbance(capacities: list[Capacity], undisturbed: list[Capacity] | None) -> str:
    """Which runs were disturbed, and whether the ranking of the policies holds without them."""
    runs = sorted({run for c in capacities for run in c.disturbed_runs})
    if not runs:
        return "No run was disturbed."
    named = (f"Disturbed runs (the engine, or a url run's load generator, got too little of the CPU it asked "
             f"for): {', '.join(runs)}.")
    if undisturbed is None:
        return named
    if not undisturbed:
        return f"{named} Without them no capacity is left to rank."
    before, after = policy_ranking(capacities), policy_ranking(undisturbed)
    left = {c.scheduler for c in undisturbed}
    lost = sorted({c.scheduler for c in capacities} - left)
    without = f" ({', '.join(lost)}: every run disturbed)" if lost else ""
    if before == after:
        return f"{named} Without them the ranking of the policies holds ({after})."
    return f"{named} **Without them the ranking changes**: {after}{without} (with them: {before})."
