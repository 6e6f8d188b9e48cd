"""Serving benchmark: closed-loop clients against `verispec serve` on loopback.

Each of C clients (C = 1, 2, 4, 8) sends streamed chat requests back to back; we record the
time to first token (first content chunk), the inter-token latency (gaps between content
chunks divided by the tokens they carried) and the throughput (completion tokens of all
clients per wall second). Drafts on (the defaults: lookup + MTP, gate on) and off
(--lookup off --mtp off). The server serves one request at a time, so latency grows with C
while throughput stays that of one stream.

    python bench/serve.py [--model DIR] [--requests 3] [--max-tokens 32] [--clients 1,2,4,8]

Without --model it makes the test suite's aligned-head byte-tokenizer fixture.
Results: bench/results/serve.json (and a table on stdout for docs/benchmarks-serve.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["abc abc abc abc abc abc", "Tell me about the sea.", "one two three one two three", "how",
           "The quick brown fox jumps over the lazy dog.", "x y z x y z x y z", "hello there", "count: 1 2 3 4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one_request(base: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            now = time.perf_counter()
            if ch["choices"][0]["delta"].get("content"):
                if first is None:
                    first = now
                elif last is not None:
                    gaps.append(now - last)
                last = now
            if ch["choices"][0]["finish_reason"]:
                tokens = len(ch["verispec"]["completion_ids"])
    # a chunk may carry several tokens (held UTF-8 bytes): spread the gaps over the tokens
    itl = sum(gaps) / max(tokens - 1, 1) if tokens > 1 else None
    return {"ttft": (first or time.perf_counter()) - t0, "itl": itl, "tokens": tokens,
            "seconds": time.perf_counter() - t0}


def closed_loop(base: str, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(i: int):
        for j in range(requests):
            r = one_request(base, model, PROMPTS[(i * requests + j) % len(PROMPTS)] + f" #{i}.{j}", max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    itl = [r["itl"] for r in results if r["itl"] is not None]
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "requests": len(results), "tokens": tokens, "wall_s": wall,
            "throughput_tok_s": tokens / wall,
            "ttft_p50_s": _pct(ttft, 0.5), "ttft_p95_s": _pct(ttft, 0.95),
            "itl_p50_s": _pct(itl, 0.5), "itl_p95_s": _pct(itl, 0.95)}


def run_server(model: Path, flags: list[str], log: Path):
    port = _free_port()
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--model", str(model), "--port", str(port),
           "--context", "1024", "--queue", "64", "--usage-save", "off", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {log}")
        try:
            if httpx.get(base + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            proc.kill()
            raise SystemExit("server did not start")
        time.sleep(0.2)
    model_id = httpx.get(base + "/v1/models").json()["data"][0]["id"]
    return proc, base, model_id


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--label", default=None)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads (default 1)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    a = ap.parse_args()
    if a.model:
        model, label = Path(a.model), a.label or Path(a.model).name
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from model_fixtures import fixture_dir
        model = fixture_dir("qwen3_next", 0, mtp=True, byte_tokenizer=True, aligned_head=True)
        label = a.label or "fixture qwen3_next s0 (aligned MTP head, byte tokenizer)"
    arms = {"drafts on": [], "drafts off": ["--lookup", "off", "--mtp", "off"]}
    rows = []
    for arm, flags in arms.items():
        proc, base, model_id = run_server(model, flags + ["--threads", str(a.threads)],
                                          Path(a.out).with_suffix(f".{arm.split()[1]}.log"))
        try:
            one_request(base, model_id, "warm up", 4)
            for c in [int(x) for x in a.clients.split(",")]:
                r = closed_loop(base, model_id, c, a.requests, a.max_tokens)
                r.update(arm=arm, model=label)
                rows.append(r)
                print(f"{arm:10s} clients {c}: ttft p50 {r['ttft_p50_s'] * 1e3:.0f} ms p95 "
                      f"{r['ttft_p95_s'] * 1e3:.0f} ms | itl p50 {r['itl_p50_s'] * 1e3:.1f} ms p95 "
                      f"{r['itl_p95_s'] * 1e3:.1f} ms | {r['throughput_tok_s']:.1f} tok/s", flush=True)
            rows[-1]["metrics"] = httpx.get(base + "/metrics").text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "load_avg_1m_at_end": os.getloadavg()[0]},
           "settings": {"requests_per_client": a.requests, "server_threads": a.threads, "max_tokens": a.max_tokens, "temperature": 0,
                        "stream": True}, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
