"""The stateful Python interpreter (issue 38): a warm cell, a second ``import pandas`` and a cell returning a
100 KB PNG, each beside a floor measured in the same run, in the same sandbox.

    python -m bench.interpreter [--cells 300] [--runs 3] [--sandbox container|gvisor] [--data-image IMAGE]
                                [--json PATH]

One sandbox (audit off) on the worker image. Measured on the host around the calls, interleaved ``--runs``
times:

- ``warm_cell``: ``sb.run_code("x += 1")`` in a context that has run cells before (goal: p50 <= 5 ms);
- ``run_python`` (the floor): a fresh ``run_python`` of the same code (``x = 0; x += 1``: its state gone after);
- ``ping``: one call's round trip on the same sandbox, for scale;
- ``png_cell``: a cell whose value is ``IPython.display.Image`` of a 100 KB PNG (noise, so it does not
  compress; made once in the context, outside the timing): 133 KB of base64 back to the host and decoded
  into ``Result.png``; its floor is ``warm_cell``;
- ``first_cell``: ``create_code_context()`` then its first cell (``1``): the price of a fresh context
  (IPython's start), against ``run_python``'s.

Then, in one sandbox on ``--data-image`` (default ``toolcage-data:dev``: the worker image with pandas and
matplotlib, ``toolcage image build --pip pandas --pip matplotlib --tag toolcage-data:dev``), ``--runs``
times a new context each: ``import_pandas_first`` and ``import_pandas_second`` in the same context, and
``run_python_import_pandas``: a fresh ``run_python`` that imports it (what a step paid before contexts).
Skipped, and said so in the output, when the image is not there.

Printed as JSON: p50 and p90 of each in ms, and the ratios of the p50s to their floors. Goal: warm_cell.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import toolcage
from toolcage import Sandbox

POLICY: dict[str, Any] = {"extends": "default", "timeouts": {"run_s": 1800, "idle_s": 600, "call_s": 120}}
GOAL_WARM_MS = 5.0

# a PNG of noise, width x height RGB, made in the context (zlib of random bytes does not shrink): ~100 KB
MAKE_PNG = """
import os, struct, zlib
from IPython.display import Image
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
_w, _h = 184, 180
_rows = b"".join(b"\\x00" + os.urandom(_w * 3) for _ in range(_h))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", _w, _h, 8, 2, 0, 0, 0))
       + _chunk(b"IDAT", zlib.compress(_rows, 1)) + _chunk(b"IEND", b""))
len(png)
"""


def _ms(t: float) -> float:
    return (time.perf_counter() - t) * 1000


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


def warm(sb: Sandbox, n: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"warm_cell": [], "run_python": [], "ping": [], "png_cell": []}
    for _ in range(n):
        t = time.perf_counter()
        ex = sb.run_code("x += 1")
        got["warm_cell"].append(_ms(t))
        assert ex.status == "ok", ex
        t = time.perf_counter()
        r = sb.call("run_python", {"code": "x = 0; x += 1"})
        got["run_python"].append(_ms(t))
        assert r.ok, r
        t = time.perf_counter()
        assert sb.call("ping").ok
        got["ping"].append(_ms(t))
    for _ in range(max(5, n // 10)):
        t = time.perf_counter()
        ex = sb.run_code("Image(data=png)")
        got["png_cell"].append(_ms(t))
        assert ex.results and ex.results[0].png and not ex.dropped, ex.dropped
    return got


def fresh_contexts(sb: Sandbox, n: int) -> list[float]:
    got = []
    for _ in range(n):
        t = time.perf_counter()
        ctx = sb.create_code_context()
        ex = sb.run_code("1", ctx)
        got.append(_ms(t))
        assert ex.text == "1", ex
        sb.remove_code_context(ctx)
    return got


def _have(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


def pandas_imports(image: str, sandbox: str, runs: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {
        "import_pandas_first": [],
        "import_pandas_second": [],
        "run_python_import_pandas": [],
    }
    with Sandbox(POLICY, image=image, sandbox=sandbox, audit=False) as sb:
        sb.run_code("1")  # the default context's start is not what is measured
        for _ in range(runs):
            ctx = sb.create_code_context()
            sb.run_code("1", ctx)
            for key in ("import_pandas_first", "import_pandas_second"):
                t = time.perf_counter()
                ex = sb.run_code("import pandas", ctx)
                got[key].append(_ms(t))
                assert ex.status == "ok", ex.error
            sb.remove_code_context(ctx)
            t = time.perf_counter()
            r = sb.call("run_python", {"code": "import pandas"})
            got["run_python_import_pandas"].append(_ms(t))
            assert r.ok and r.result.get("exit_code") == 0, r
    return got


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.interpreter")
    ap.add_argument("--cells", type=int, default=300, help="warm cells per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sandbox", default="container")
    ap.add_argument("--data-image", default="toolcage-data:dev", help="an image with pandas (see the docstring)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    series: dict[str, list[float]] = {k: [] for k in ("warm_cell", "run_python", "ping", "png_cell", "first_cell")}
    load = os.getloadavg()
    with Sandbox(POLICY, sandbox=args.sandbox, audit=False) as sb:
        sb.run_code("x = 0")
        png_bytes = int(sb.run_code(MAKE_PNG).text or 0)
        warm(sb, 20)  # warm
        for _ in range(args.runs):
            for k, v in warm(sb, args.cells).items():
                series[k] += v
            series["first_cell"] += fresh_contexts(sb, 5)
    data: dict[str, Any]
    if _have(args.data_image):
        for k, v in pandas_imports(args.data_image, args.sandbox, args.runs * 2).items():
            series[k] = v
        data = {"image": args.data_image}
    else:
        data = {"image": args.data_image, "skipped": "no such image: build it as the docstring says"}
    p50 = {k: statistics.median(v) for k, v in series.items() if v}
    ratios = {
        "warm_cell / run_python": round(p50["warm_cell"] / p50["run_python"], 3),
        "warm_cell / ping": round(p50["warm_cell"] / p50["ping"], 2),
        "png_cell / warm_cell": round(p50["png_cell"] / p50["warm_cell"], 2),
        "first_cell / run_python": round(p50["first_cell"] / p50["run_python"], 2),
    }
    if "import_pandas_first" in p50:
        ratios["import_pandas_second / import_pandas_first"] = round(
            p50["import_pandas_second"] / p50["import_pandas_first"], 4
        )
        ratios["import_pandas_second / run_python_import_pandas"] = round(
            p50["import_pandas_second"] / p50["run_python_import_pandas"], 4
        )
    result = {
        "bench": "interpreter",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "toolcage": toolcage.__version__,
        "python": platform.python_version(),
        "sandbox": args.sandbox,
        "load_average": [round(x, 2) for x in (*load, *os.getloadavg())],  # before (1, 5, 15 min), after
        "cells": args.cells,
        "runs": args.runs,
        "png_bytes": png_bytes,
        "data": data,
        "p50_ms": {k: round(v, 3) for k, v in p50.items()},
        "p90_ms": {k: _p(v, 0.9) for k, v in series.items() if v},
        "ratios": ratios,
        "goal": {"warm_cell_p50_ms": GOAL_WARM_MS, "met": p50["warm_cell"] <= GOAL_WARM_MS},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
