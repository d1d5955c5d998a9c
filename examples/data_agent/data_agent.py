"""A data agent's loop on toolcage's Python interpreter (issue 38), with a scripted agent in place of a model.

The agent's steps are cells run in one Python context of a sandbox whose image has pandas and matplotlib, so
each step builds on the last: the CSV is read once, the DataFrame stays loaded, a mistake (a column that is
not there) is the cell's error and the context lives on, and a chart comes back as a PNG result (a matplotlib
figure left open at the end of the cell; no ``savefig``, no file to download). A model would choose the
cells; everything else is what an agent framework's tool does (``code_run``).

    toolcage image build --pip pandas --pip matplotlib --tag toolcage-data:dev   # once
    python examples/data_agent/data_agent.py                        # prints one JSON line per step
    python examples/data_agent/data_agent.py --image my-data:1 --out charts/   # another image; PNGs saved

The image: ``--image``, else ``$TOOLCAGE_DATA_IMAGE``, else ``toolcage-data:dev``. ``--out DIR`` writes each
PNG there (its bytes only: nothing is rendered or opened on the host).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolcage import Execution, Sandbox

HERE = Path(__file__).resolve().parent
DEFAULT_IMAGE = "toolcage-data:dev"

# (what the agent wants to know, the cell it runs): a model's tool calls, written out
STEPS: list[tuple[str, str]] = [
    (
        "load",
        'import pandas as pd\ndf = pd.read_csv("sales.csv", parse_dates=["month"])\n'
        "print(f\"{len(df)} rows; columns: {', '.join(df.columns)}\")\ndf.head(3)",
    ),
    (
        "summarise",
        'by_region = df.groupby("region")["revenue"].agg(["sum", "mean"]).sort_values("sum", ascending=False)\n'
        "by_region.round(1)",
    ),
    ("mistake", 'df["profit"].sum()'),
    (
        "answer",
        "best = by_region.index[0]\nf\"best region: {best}, {by_region.loc[best, 'sum']:,.0f} in revenue over "
        '{df.month.nunique()} months"',
    ),
    (
        "chart",
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(6, 3.5))\n"
        'df.pivot_table(index="month", columns="region", values="revenue").plot(ax=ax, marker="o")\n'
        'ax.set_title("Revenue by region"); ax.set_ylabel("revenue");',
    ),
]


def what_came_back(step: str, ex: Execution, seconds: float) -> dict[str, Any]:
    """One step's answer, as a model's tool result would show it (images by size, not as base64)."""
    results = []
    for r in ex.results:
        item: dict[str, Any] = {"formats": r.formats(), "main": r.is_main_result}
        if r.text is not None:
            item["text"] = r.text if len(r.text) <= 400 else r.text[:400] + "..."
        if r.png is not None:
            item["png_bytes"] = len(base64.b64decode(r.png))
        results.append(item)
    return {
        "step": step,
        "execution_count": ex.execution_count,
        "status": ex.status,
        "stdout": "".join(ex.logs.stdout),
        "results": results,
        "error": None if ex.error is None else f"{ex.error.name}: {ex.error.value}",
        "seconds": round(seconds, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_DATA_IMAGE", DEFAULT_IMAGE))
    ap.add_argument("--csv", type=Path, default=HERE / "sales.csv")
    ap.add_argument("--out", type=Path, help="a directory for the charts' PNG files")
    args = ap.parse_args(argv)
    have = subprocess.run(["docker", "image", "inspect", args.image], capture_output=True, check=False)
    if have.returncode != 0:
        print(
            f"no image {args.image!r}: build it with\n"
            f"  toolcage image build --pip pandas --pip matplotlib --tag {args.image}",
            file=sys.stderr,
        )
        return 2
    with Sandbox(image=args.image) as sb:
        sb.write_files({"sales.csv": args.csv.read_bytes()})  # into /scratch, the context's working directory
        ctx = sb.create_code_context()
        for step, code in STEPS:
            started = time.monotonic()
            ex = sb.run_code(code, ctx, timeout=120)
            print(json.dumps(what_came_back(step, ex, time.monotonic() - started)), flush=True)
            if args.out is not None:
                for i, r in enumerate(r for r in ex.results if r.png is not None):
                    args.out.mkdir(parents=True, exist_ok=True)
                    (args.out / f"{step}-{i + 1}.png").write_bytes(base64.b64decode(r.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
