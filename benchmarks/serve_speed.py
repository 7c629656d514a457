"""How many `/api/estimate` requests per second `ftscope serve` answers (target >= 200), and how long one takes.

Starts `ftscope serve --port 0` on 127.0.0.1, checks that its answer is byte for byte what
`ftscope estimate FILE --json` prints, then sends a bounded number of POST requests (JSON scenario in) from a
few keep-alive client threads and prints requests/s and the latency percentiles. Only loopback traffic; it
stops by itself. Run on a quiet machine: the server and the clients share the CPU cores.

    .venv/bin/python benchmarks/serve_speed.py [--requests 3000] [--clients 4]
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FTSCOPE = str(Path(sys.executable).parent / "ftscope")
SCENARIOS = ["examples/iiswc-mixtral-qlora.yaml", "examples/llama2-7b-lora-zero2-8gpu.yaml",
             "examples/long-context-llama31-8b.yaml"]


def post(conn: http.client.HTTPConnection, body: bytes) -> bytes:
    conn.request("POST", "/api/estimate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
    return data


def client(port: int, bodies: list[bytes], count: int, latencies: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(count):
        t0 = time.perf_counter()
        post(conn, bodies[i % len(bodies)])
        latencies.append(time.perf_counter() - t0)
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    server = subprocess.Popen([FTSCOPE, "serve", "--port", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        port = int(re.search(r":(\d+)/", server.stdout.readline()).group(1))
        bodies = [json.dumps(yaml.safe_load((ROOT / s).read_text())).encode() for s in SCENARIOS]
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for scenario, body in zip(SCENARIOS, bodies):
            cli = subprocess.run([FTSCOPE, "estimate", scenario, "--json"], capture_output=True, text=True, cwd=ROOT)
            assert post(warm, body).decode() == cli.stdout, f"{scenario}: the API's answer differs from the CLI's"
        for _ in range(50):  # warm the model cache and the interpreter
            post(warm, bodies[0])
        warm.close()
        per_client = args.requests // args.clients
        latencies: list[float] = []
        threads = [threading.Thread(target=client, args=(port, bodies, per_client, latencies)) for _ in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait(timeout=30)
    n = len(latencies)
    ms = sorted(x * 1000 for x in latencies)
    print(f"/api/estimate: {n:,} requests from {args.clients} clients in {took:.2f} s = {n / took:,.0f} requests/s "
          f"(target >= 200); latency median {statistics.median(ms):.1f} ms, p99 {ms[int(0.99 * (n - 1))]:.1f} ms; "
          f"answers equal `ftscope estimate --json` for {len(SCENARIOS)} scenarios")


if __name__ == "__main__":
    main()
