"""Rate ramps (vLLM's ``--ramp-up-strategy``): the arrival process's rate rises with time from
``ramp_up_start_qps`` to ``ramp_up_end_qps``, linearly or exponentially, over the span its requests take.

The ramp is a time warp (the time-rescaling theorem): the process is drawn at rate 1 and each send time u is
moved to the t where the ramp's expected count reaches u, Lambda(t) = integral of rate over [0, t]. So Poisson
stays Poisson, gamma keeps its cv and constant stays evenly spread in expected count, each at the ramp's rate.
The span T is the one whose expected count is the n - 1 gaps of n requests; a draw that runs past it goes on
at the end rate. (vLLM raises the rate with the request's index instead, so its rate is not linear in time.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stallfree.engine.config_checks import is_number, require

STRATEGIES = ("linear", "exponential")
RAMP_KEYS = ("ramp_up_strategy", "ramp_up_start_qps", "ramp_up_end_qps")


@dataclass(frozen=True)
class RampUp:
    strategy: str
    start_qps: float
    end_qps: float

    def __post_init__(self) -> None:
        require(self.strategy in STRATEGIES, "arrival.ramp_up_strategy", f"one of {list(STRATEGIES)} or null",
                self.strategy)
        linear = self.strategy == "linear"
        require(is_number(self.start_qps) and (self.start_qps >= 0 if linear else self.start_qps > 0),
                "arrival.ramp_up_start_qps", ">= 0" if linear else "> 0 for an exponential ramp", self.start_qps)
        require(is_number(self.end_qps) and self.end_qps > 0 and self.end_qps >= self.start_qps,
                "arrival.ramp_up_end_qps", f"> 0 and >= arrival.ramp_up_start_qps={self.start_qps} (a ramp up)",
                self.end_qps)

    @classmethod
    def split(cls, arrival: dict) -> tuple[RampUp | None, dict]:
        """(the ramp of an arrival config, None without one; the config without the ramp's keys)."""
        rest = {k: v for k, v in arrival.items() if k not in RAMP_KEYS}
        strategy = arrival.get("ramp_up_strategy")
        for key in RAMP_KEYS[1:]:
            rule = "set with" if strategy is not None else "unset without"
            require((arrival.get(key) is not None) == (strategy is not None), f"arrival.{key}",
                    f"{rule} arrival.ramp_up_strategy", arrival.get(key))
        if strategy is None:
            return None, rest
        require("qps" in rest, "arrival.ramp_up_strategy", "null unless the arrival process is driven by qps "
                "(poisson, gamma, constant)", arrival["ramp_up_strategy"])
        return cls(arrival["ramp_up_strategy"], arrival["ramp_up_start_qps"], arrival["ramp_up_end_qps"]), rest

    def span_s(self, n: int) -> float:
        """T: the time by which the ramp's expected count is n - 1."""
        s, e, count = self.start_qps, self.end_qps, max(n - 1, 0)
        if e == s:
            return count / s
        if self.strategy == "linear":
            return 2 * count / (s + e)
        return count * math.log(e / s) / (e - s)

    def rate(self, t: np.ndarray, n: int) -> np.ndarray:
        """The ramp's rate at times t (the end rate after the span)."""
        s, e, span = self.start_qps, self.end_qps, self.span_s(n)
        x = np.clip(np.asarray(t, dtype=float) / span, 0.0, 1.0) if span > 0 else np.ones_like(t, dtype=float)
        return s + (e - s) * x if self.strategy == "linear" else s * (e / s) ** x

    def expected_count(self, t: np.ndarray, n: int) -> np.ndarray:
        """Lambda(t): the expected number of gaps by time t."""
        s, e, span = self.start_qps, self.end_qps, self.span_s(n)
        t = np.asarray(t, dtype=float)
        within = np.minimum(t, span)
        if e == s:
            ramp = s * within
        elif self.strategy == "linear":
            ramp = s * within + (e - s) * within**2 / (2 * span)
        else:
            k = math.log(e / s) / span
            ramp = s * np.expm1(k * within) / k
        return ramp + e * np.maximum(t - span, 0.0)

    def warp(self, unit_offsets: np.ndarray, n: int) -> np.ndarray:
        """Send times of a rate-1 draw moved onto the ramp: Lambda^-1 of each."""
        s, e, span = self.start_qps, self.end_qps, self.span_s(n)
        u = np.asarray(unit_offsets, dtype=float)
        at_span = float(self.expected_count(np.array(span), n))
        within = np.minimum(u, at_span)
        if e == s:
            t = within / s
        elif self.strategy == "linear":
            slope = (e - s) / span
            root = s + np.sqrt(s * s + 2 * slope * within)  # the quadratic's root in its stable form
            t = np.divide(2 * within, root, out=np.zeros_like(within), where=root > 0)
        else:
            k = math.log(e / s) / span
            t = np.log1p(k * within / s) / k
        return t + np.maximum(u - at_span, 0.0) / e
