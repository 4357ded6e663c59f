"""The Locust web UI screenshots of docs/bench.md, taken against a real model: `stallfree-serve` on
`smollm2` (SmolLM2-135M-Instruct), loaded through `/v1/chat/completions` with prompts cut from the
bundled sonnets (the `sonnet` text workload), two closed-loop users.

    python -m benchmarks.locust_screenshots [--out docs/images] [--seconds 40]

Needs Chromium at /usr/bin/chromium and playwright (the dev extra). Writes locust_ui.png (Statistics)
and locust_llm_tab.png (the LLM tab), and prints the LLM tab's whole-run row.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.server_overhead import start_server
from stallfree.engine.model.arch import ArchConfig
from stallfree.engine.model.presets import resolve_model_path
from stallfree.loadgen.targets.server_process import free_port
from stallfree.loadgen.workload.request_specs import build_workload
from stallfree.loadgen.workload.text_prompts import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SONNET = {"kind": "sonnet", "input_len": 160, "prefix_len": 48, "output_len": 48}


def write_specs(model: str, path: Path, num_requests: int) -> None:
    model_dir = resolve_model_path(model)
    specs = build_workload({"kind": "burst"}, SONNET, num_requests, seed=0,
                           vocab_size=ArchConfig.from_dir(model_dir).vocab_size,
                           tokenizer=load_tokenizer(str(model_dir)))
    path.write_text("".join(json.dumps(dataclasses.asdict(spec)) + "\n" for spec in specs))


def start_web_ui(host: str, specs: Path, decode_iter_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    ui = subprocess.Popen([str(Path(sys.executable).with_name("locust")), "-f", str(ROOT / "loadgen" / "locustfile.py"),
                           "--host", host, "--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING",
                           "LLMUser", "--endpoint", "chat", "--specs-file", str(specs), "--slo", "relaxed",
                           "--decode-iter-ms", str(decode_iter_ms)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    web = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(web, timeout=1, trust_env=False)
            return ui, web
        except httpx.TransportError:
            time.sleep(0.3)
    ui.kill()
    raise RuntimeError("the Locust web UI did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", default="docs/images")
    ap.add_argument("--seconds", type=float, default=40.0, help="load before the first screenshot")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--decode-iter-ms", type=float, default=60.0, help="for the relaxed SLO's TBT bound (25x)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(args.model, port, 256, "model.dtype=float32")
    with tempfile.TemporaryDirectory() as tmp:
        specs = Path(tmp) / "specs.jsonl"
        write_specs(args.model, specs, num_requests=200)
        ui, web = start_web_ui(f"http://127.0.0.1:{port}", specs, args.decode_iter_ms)
        try:
            swarm = httpx.post(f"{web}/swarm", data={"user_count": args.users, "spawn_rate": args.users},
                               trust_env=False)
            assert swarm.json()["success"], swarm.text
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1400, "height": 560})
                page.goto(web)
                page.wait_for_timeout(args.seconds * 1000)
                page.screenshot(path=str(out / "locust_ui.png"))
                page.get_by_role("tab", name="LLM").click()
                page.get_by_role("cell", name="whole run", exact=True).wait_for(timeout=30_000)
                page.wait_for_timeout(3000)
                page.screenshot(path=str(out / "locust_llm_tab.png"))
                browser.close()
            print(httpx.get(f"{web}/llm_stats/csv", trust_env=False).text.splitlines()[-1])
        finally:
            ui.terminate()
            ui.wait(30)
            server.stop()
    print(f"wrote {out / 'locust_ui.png'} and {out / 'locust_llm_tab.png'}")


if __name__ == "__main__":
    main()
