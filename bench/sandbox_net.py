"""What a sandboxed agent's own network namespace costs (tasks/sandbox_net.py): the start of a
sandboxed command and its HTTP requests to a host server, three ways in one process, on the same
server and client:

- `host network`: the command shares the host's network and connects to the server's TCP port
  (what agents had before the namespace);
- `own namespace, no relay`: a network namespace with nothing forwarded (graders, the shell tool;
  start cost only);
- `own namespace + relay`: 127.0.0.1:PORT inside relayed to the server's Unix socket (what every
  agent has now).

    HARNESSRL_THREADS=1 .venv/bin/python bench/sandbox_net.py [--repeats 15] [--requests 200] [--record]

Per way: the median wall time of a sandboxed `true` (start to exit), and inside one sandboxed
client, the median time of a small HTTP request (a 200-byte JSON reply, a new connection each,
as an OpenAI client without keep-alive does) and of a 1 MB reply. Needs bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available, run_sandboxed  # noqa: E402
from harnessrl.tasks.sandbox_net import Forward, socket_path  # noqa: E402
from harnessrl.wire.http import BackgroundServer  # noqa: E402

CLIENT = """
import http.client, json, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
def get(path):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    body = c.getresponse().read()
    c.close()
    return time.perf_counter() - t0, len(body)
small = [get("/small") for _ in range(n)]
big = [get("/big") for _ in range(max(5, n // 20))]
assert all(size == 1 << 20 for _, size in big)
print(json.dumps({"small_ms": 1e3 * statistics.median(t for t, _ in small),
                  "big_ms": 1e3 * statistics.median(t for t, _ in big)}))
"""


def app():
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    api = FastAPI()
    payload = {"id": "x" * 150, "object": "chat.completion"}

    @api.get("/small")
    async def small() -> JSONResponse:
        return JSONResponse(payload)

    @api.get("/big")
    async def big() -> Response:
        return Response(b"x" * (1 << 20), media_type="application/octet-stream")

    return api


def start_ms(repeats: int, work: Path, **how) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = run_sandboxed(["true"], workdir=work, limits=ExecLimits(wall_s=30), **how)
        times.append(time.perf_counter() - t0)
        assert result.returncode == 0, result
    return round(1e3 * statistics.median(times), 1)


def requests(port: int, n: int, work: Path, **how) -> dict:
    result = run_sandboxed(
        ["/usr/bin/python3", "-c", CLIENT, str(port), str(n)],
        workdir=work,
        limits=ExecLimits(wall_s=300, cpu_s=300),
        **how,
    )
    assert result.returncode == 0, result
    return {k: round(v, 3) for k, v in json.loads(result.stdout).items()}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="sandbox starts per way")
    p.add_argument("--requests", type=int, default=200, help="small requests per way (1 MB ones: a twentieth)")
    p.add_argument("--record", action="store_true", help="append to bench/results/sandbox_net.jsonl")
    args = p.parse_args(argv)
    if isolation_available() != "bwrap":
        sys.exit("bubblewrap does not work here: nothing to compare")
    sock = socket_path("bench-sandbox-net.sock")
    server = BackgroundServer(app(), name="bench", unix_path=sock)
    port = int(server.start().rsplit(":", 1)[1])
    work = Path(tempfile.mkdtemp(prefix="harnessrl-bench-net-", dir="/tmp"))
    work.chmod(0o755)
    ways = {
        "host network": {"network": True},
        "own namespace, no relay": {"network": False},
        "own namespace + relay": {"network": False, "forward": [Forward(listen=port, connect=sock)]},
    }
    rows = []
    try:
        for name, how in ways.items():
            row = {"way": name, "sandbox start ms (median)": start_ms(args.repeats, work, **how)}
            if name != "own namespace, no relay":
                timed = requests(port, args.requests, work, **how)
                row["small request ms (median)"] = timed["small_ms"]
                row["1 MB reply ms (median)"] = timed["big_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    base, relay = rows[0], rows[2]
    summary = {
        "way": "relay / host network",
        "sandbox start ms (median)": round(relay["sandbox start ms (median)"] / base["sandbox start ms (median)"], 2),
        "small request ms (median)": round(relay["small request ms (median)"] / base["small request ms (median)"], 2),
        "1 MB reply ms (median)": round(relay["1 MB reply ms (median)"] / base["1 MB reply ms (median)"], 2),
    }
    rows.append(summary)
    print(json.dumps(summary))
    if args.record:
        from results import record_run

        record_run("sandbox_net", rows, results={"repeats": args.repeats, "requests": args.requests})
    return rows


if __name__ == "__main__":
    main()
