"""Draw the plots of docs/benchmarks.md from the recorded figures (bench/data/recorded.json), never by hand.

    python -m bench.plots            # writes docs/assets/bench/*.svg

Each figure in the JSON says its date, machine and the bench command that measured it; a plot's caption
repeats them. The SVGs are deterministic (no date, fixed ids), so a redraw with the same data and the same
matplotlib changes no byte. matplotlib is in the ``docs`` extra (``pip install -e '.[docs]'``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "recorded.json"
OUT = ROOT / "docs" / "assets" / "bench"


def _setup() -> Any:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.hashsalt": "toolcage",
            "svg.fonttype": "none",
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _caption(s: dict[str, Any], machine: str) -> str:
    return f"{s['date']} · {s['command']}\n{machine}"


def _save(plt: Any, fig: Any, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.svg"
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "bench/plots.py"})
    plt.close(fig)
    return path


def _hbars(plt: Any, s: dict[str, Any], machine: str, title: str, xlabel: str, log: bool = False) -> Any:
    """One horizontal bar per row (a label and one value)."""
    labels = [r[0] for r in s["rows"]][::-1]
    values = [r[1] for r in s["rows"]][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.6))
    bars = ax.barh(labels, values, color="#607d8b")
    ax.bar_label(bars, labels=[f"{v:g}" for v in values], padding=3)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left", fontweight="bold")
    fig.text(0, -0.02, _caption(s, machine), fontsize=7, color="#555", va="top")
    return fig


def _grouped(plt: Any, s: dict[str, Any], machine: str, title: str, xlabel: str, log: bool = False) -> Any:
    """Horizontal bars, one group per row and one bar per column."""
    cols: list[str] = s["columns"]
    rows = s["rows"][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) * len(cols) / 2 + 1.8))
    height = 0.8 / len(cols)
    colors = ["#607d8b", "#ff7043", "#9e9e9e"]
    for j, col in enumerate(cols):
        ys = [i + ((len(cols) - 1) / 2 - j) * height for i in range(len(rows))]  # the first column on top
        vals = [r[1 + j] for r in rows]
        bars = ax.barh(ys, vals, height=height, label=col, color=colors[j % len(colors)])
        ax.bar_label(bars, labels=[f"{v:g}" for v in vals], padding=3, fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)  # beside the bars, never over them
    ax.set_title(title, loc="left", fontweight="bold")
    fig.text(0, -0.02, _caption(s, machine), fontsize=7, color="#555", va="top")
    return fig


def _goals(plt: Any, s: dict[str, Any], machine: str) -> Any:
    """One bar per goal: what was measured over what the goal allows (a goal "at least" is turned round, so that
    1 is the goal's edge and a bar past it is a MISS for every goal), its verdict in its colour."""
    rows = s["rows"][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(rows) + 1.8))
    values = [r[1] for r in rows]
    colors = ["#43a047" if v <= 1 else "#e53935" for v in values]
    bars = ax.barh([r[0] for r in rows], values, color=colors)
    ax.bar_label(bars, labels=[f"{v:.2f}  {'PASS' if v <= 1 else 'MISS'}" for v in values], padding=3, fontsize=8)
    ax.axvline(1.0, color="#333", linewidth=1, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlim(right=max(values) * 4)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("measured ÷ goal, each against a floor of its own run (log scale; 1 is the goal's edge)")
    ax.set_title(f"Issue 40's goals, {s['date']}", loc="left", fontweight="bold")
    fig.text(0, -0.02, _caption(s, machine), fontsize=7, color="#555", va="top")
    return fig


def _cluster(plt: Any, s: dict[str, Any], machine: str) -> Any:
    nodes = [r[0] for r in s["rows"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(nodes, [r[1] for r in s["rows"]], marker="o", color="#607d8b", label="whole cluster")
    a.plot(nodes, [r[2] for r in s["rows"]], marker="o", color="#ff7043", label="per node")
    a.set_xticks(nodes)
    a.set_xlabel("worker nodes (all on the same 2 vCPUs)")
    a.set_ylabel("fresh sandboxes / s")
    a.set_ylim(bottom=0)
    a.legend(frameon=False)
    a.set_title("Burst of 200 runs: rate", loc="left", fontweight="bold")
    b.plot(nodes, [r[3] for r in s["rows"]], marker="o", color="#607d8b", label="p50")
    b.plot(nodes, [r[4] for r in s["rows"]], marker="o", color="#ff7043", label="p99")
    b.set_xticks(nodes)
    b.set_xlabel("worker nodes")
    b.set_ylabel("time to answer in the burst (s)")
    b.set_ylim(bottom=0)
    b.legend(frameon=False)
    b.set_title("… and time to answer", loc="left", fontweight="bold")
    fig.text(0, -0.04, _caption(s, machine), fontsize=7, color="#555", va="top")
    fig.tight_layout()
    return fig


def main() -> int:
    data = json.loads(DATA.read_text())
    machine, sets = data["machine"], data["sets"]
    plt = _setup()
    made = [
        _save(
            plt,
            _hbars(plt, sets["start"], machine, "Time to a first answer (p50)", "ms (log scale)", log=True),
            "start",
        ),
        _save(
            plt,
            _grouped(plt, sets["gvisor"], machine, "runc beside gVisor (p50)", "ms (log scale)", log=True),
            "gvisor",
        ),
        _save(plt, _grouped(plt, sets["memory"], machine, "Memory per warm sandbox, in its cgroup", "MiB"), "memory"),
        _save(
            plt, _grouped(plt, sets["files"], machine, "Moving files: toolcage beside docker cp", "seconds"), "files"
        ),
        _save(
            plt,
            _grouped(
                plt,
                sets["files_issue40"],
                machine,
                "Moving files after issue 40: toolcage beside docker cp",
                "seconds (log scale)",
                log=True,
            ),
            "files_issue40",
        ),
        _save(
            plt,
            _hbars(plt, sets["copy_issue40"], machine, "A writable copy of 100,000 files and its floors", "seconds"),
            "copy_issue40",
        ),
        _save(plt, _cluster(plt, sets["cluster"], machine), "cluster"),
        _save(plt, _goals(plt, sets["goals_issue40"], machine), "goals_issue40"),
        _save(
            plt,
            _grouped(
                plt,
                sets["openai_agents"],
                machine,
                "OpenAI Agents SDK sandbox clients (medians)",
                "ms (log scale)",
                log=True,
            ),
            "openai_agents",
        ),
    ]
    for path in made:
        print(path.relative_to(ROOT), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
