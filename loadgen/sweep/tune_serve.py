"""``tune.serve_cmd``: a server that is not ours, tuned live through its launch flags (as vLLM's ``bench sweep
serve`` takes a command). There is no simulation: no cost model of that server exists here.

The grid is ``tune.chunk_sizes`` x ``tune.max_num_seqs``, each axis only where the command names it
(``{chunk_size}``, ``{max_num_seqs}``). It is searched best first: a coarse pass over every other value of each
axis (and its last), then the neighbours of the best measured setting, again while the best moves. For each
setting the command is started on ``target.url``'s port (loadgen.targets.server_process: its own process group,
ready once ``GET /health`` answers), its capacity searched (loadgen.sweep.capacity_search, the runs labelled ``target.label`` (else
``served``) and the setting), and the server stopped with its whole process group, whatever happened. A setting whose server does
not start, or exits during its search, is a row with its reason, and the search goes on. The SLO is resolved on
the first server that starts and pinned for the others. ``tune.max_minutes`` ends the search once the next
setting, at the mean wall time of those before it, would not fit: the settings left are named.
"""
from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from urllib.parse import urlsplit

from stallfree.loadgen.config.errors import TargetError
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.search_groups import TuneGroup, serve_keys
from stallfree.loadgen.sweep.capacity_search import run_search
from stallfree.loadgen.sweep.live_target import LiveTarget
from stallfree.loadgen.sweep.slo import resolve_slo
from stallfree.loadgen.sweep.tune_grid import Setting, pinned_slo
from stallfree.loadgen.targets.server_process import ServerExited, ServerProcess

Cell = tuple[int, int]  # (chunk size index, max_num_seqs index)


def axes(tune: TuneGroup) -> tuple[list[int | None], list[int | None]]:
    keys = serve_keys(tune.serve_cmd)
    chunks = tune.chunk_sizes if "chunk_size" in keys else [None]
    seqs = (tune.max_num_seqs or [None]) if "max_num_seqs" in keys else [None]
    return chunks, seqs


def coarse(n: int) -> list[int]:
    return sorted({*range(0, n, 2), n - 1})


def neighbours(cell: Cell, shape: tuple[int, int]) -> list[Cell]:
    i, j = cell
    return [(a, b) for a, b in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1))
            if 0 <= a < shape[0] and 0 <= b < shape[1]]


class ServedTune:
    """One tune of ``cfg``'s served command; ``run`` gives the rows' inputs in the order measured."""

    def __init__(self, cfg: BenchConfig, targets: LiveTarget):
        self.cfg, self.targets, self.tune = cfg, targets, cfg.tune
        self.chunks, self.seqs = axes(self.tune)
        self.exp_dir = Path(cfg.results_dir) / cfg.experiment_name
        self.server_label = cfg.target.label or "served"  # a run's label: the server's, then the setting
        self.slo: dict | None = None
        self.measured: dict[Cell, dict] = {}  # capacity records
        self.failed: dict[Cell, str] = {}
        self.dropped: list[Cell] = []

    def setting(self, cell: Cell) -> Setting:
        return Setting("", self.chunks[cell[0]], self.seqs[cell[1]])

    def untried(self) -> list[Cell]:
        tried = {*self.measured, *self.failed, *self.dropped}
        return [(i, j) for i in range(len(self.chunks)) for j in range(len(self.seqs)) if (i, j) not in tried]

    def run(self) -> None:
        shape = (len(self.chunks), len(self.seqs))
        queue = [(i, j) for i in coarse(shape[0]) for j in coarse(shape[1])]
        start, done = time.monotonic(), 0
        while queue:
            elapsed = time.monotonic() - start
            if self.tune.max_minutes is not None and done and elapsed * (done + 1) / done > 60 * self.tune.max_minutes:
                self.dropped = queue
                print(f"[tune] tune.max_minutes={self.tune.max_minutes:g}: {done} settings fit; dropped: "
                      f"{'; '.join(self.setting(c).label for c in queue)}", flush=True)
                return
            self.measure(queue.pop(0))
            done += 1
            if not queue and self.measured:
                best = max(self.measured, key=lambda c: self.measured[c]["capacity_qps"])
                queue = [c for c in neighbours(best, shape) if c not in self.measured and c not in self.failed]

    def measure(self, cell: Cell) -> None:
        setting = self.setting(cell)
        port = urlsplit(self.cfg.target.url).port
        command = shlex.split(self.tune.serve_cmd.format(port=port, chunk_size=setting.chunk_size,
                                                         max_num_seqs=setting.max_num_seqs))
        log = self.exp_dir / ".logs" / f"serve-{setting.label.replace(', ', '-').replace(' ', '')}.log"
        server = ServerProcess(command, self.cfg.target.url, log, startup_timeout_s=self.cfg.target.startup_timeout_s)
        label = f"{self.server_label} {setting.label}"
        print(f"[tune] live: {label}", flush=True)
        try:
            server.start()
            self.slo = self.slo or resolve_slo(self.cfg, self.exp_dir, self.targets)
            base = pinned_slo(self.cfg, self.slo["decode_iter_ms"])
            record = run_search(dataclasses.replace(base, target=dataclasses.replace(base.target, label=label)),
                                self.targets)
            if server.process.poll() is not None:
                raise ServerExited(f"{server.name} exited with status {server.process.returncode} during the search "
                                   f"(log: {log})")
            self.measured[cell] = record
        except (ServerExited, TargetError, RuntimeError, OSError) as e:
            self.failed[cell] = str(e)
            print(f"[tune] {label} failed: {e}", flush=True)
        finally:
            self.targets.close()  # the same URL names the next setting's server
            server.stop()
