"""Files in and out: ``Sandbox.upload`` / ``Sandbox.download`` beside ``docker cp``, in the same run.

    python -m bench.transfer [--runs 3] [--image IMAGE] [--json PATH]

Two shapes of payload, made once in a temporary directory under /tmp (and, for downloads, made
the same way inside the sandbox and inside the plain container):

- ``big``: one file of 100 MiB of random bytes;
- ``small``: 10,000 files of 1 KiB of random bytes, in 100 directories.

Each is timed on the host around the transfer alone (the sandbox's and the container's start,
the clean-up between runs and the checks are outside the clock), ``--runs`` times, interleaved
(the order of toolcage and ``docker cp`` alternates from one run to the next):

- upload: ``sb.upload(local, "/scratch/in")`` beside ``docker cp LOCAL C:/tmp/x``;
- download: ``sb.download("/scratch/out/...", local_dir)`` beside ``docker cp C:/tmp/out/... LOCAL``.

The toolcage side is one sandbox per run, with a policy whose scratch holds the payloads (an
upload takes twice its size in scratch while it runs). The ``docker cp`` side is one plain
container of the same image (``--entrypoint sleep``, no hardening, its writable layer as the
target: ``docker cp`` does not reach a tmpfs, where toolcage's /scratch is), named
``toolcage-bench-cp-*`` and removed at the end; the figure includes the docker CLI's own start,
as a user typing it would pay. Throughput is the payload's file content (MiB) over the seconds;
the ratio is toolcage's median time over ``docker cp``'s (above 1: toolcage is slower).

The benchmarking process's peak RSS is taken around each 100 MiB toolcage transfer (the kernel's
high-water mark, VmHWM, reset before it through /proc/self/clear_refs; ``ru_maxrss`` where that
cannot be reset), to show that a transfer's memory stays bounded whatever the file's size.
Reported, no goal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import toolcage
from toolcage import DEFAULT_IMAGE, Sandbox

MiB = 1 << 20
BIG_BYTES = 100 * MiB
SMALL_DIRS, SMALL_PER_DIR, SMALL_BYTES = 100, 100, 1024
SMALL_FILES = SMALL_DIRS * SMALL_PER_DIR
PAYLOAD = {"big": BIG_BYTES, "small": SMALL_FILES * SMALL_BYTES}
FILES = {"big": 1, "small": SMALL_FILES}

POLICY: dict[str, Any] = {
    "extends": "default",
    # 100 MiB uploaded (twice that while it runs) beside 100 MiB + 10,000 small files to download
    "limits": {"scratch": "1g", "memory": "2g"},
    "timeouts": {"run_s": 600, "idle_s": 600, "call_s": 300},
}

# makes ROOT/big.bin and ROOT/small/dNN/fNNN (the same shapes as make_local) in a sandbox or container
MAKE_OUT = (
    "set -e; mkdir -p {root}; head -c {big} /dev/urandom > {root}/big.bin; "
    "python3 -c 'import os\n"
    "for d in range({dirs}):\n"
    '    p = "{root}/small/d%02d" % d\n'
    "    os.makedirs(p)\n"
    "    for f in range({per}):\n"
    '        open("%s/f%03d" % (p, f), "wb").write(os.urandom({size}))\n'
    "'"
)


def make_out(root: str) -> str:
    return MAKE_OUT.format(root=root, big=BIG_BYTES, dirs=SMALL_DIRS, per=SMALL_PER_DIR, size=SMALL_BYTES)


def make_local(root: Path) -> dict[str, Path]:
    """The two payloads on the host, written a MiB at a time (so the process's RSS does not grow)."""
    root.mkdir()
    big = root / "big.bin"
    with big.open("wb") as f:
        for _ in range(BIG_BYTES // MiB):
            f.write(os.urandom(MiB))
    small = root / "small"
    for d in range(SMALL_DIRS):
        sub = small / f"d{d:02d}"
        sub.mkdir(parents=True)
        for i in range(SMALL_PER_DIR):
            (sub / f"f{i:03d}").write_bytes(os.urandom(SMALL_BYTES))
    return {"big": big, "small": small}


def local_tree(path: Path) -> tuple[int, int]:
    """(files, bytes of content) under ``path`` (or of the file itself)."""
    if path.is_file():
        return 1, path.stat().st_size
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


# the docker CLI ------------------------------------------------------------------------------------


def docker(*argv: str) -> str:
    res = subprocess.run(["docker", *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"docker {' '.join(argv[:3])} failed: {res.stderr.strip()[-2000:]}")
    return res.stdout


@contextlib.contextmanager
def plain_container(image: str) -> Iterator[str]:
    """A running plain container of ``image`` (no hardening, a writable layer), removed at the end."""
    name = f"toolcage-bench-cp-{secrets.token_hex(6)}"
    docker("create", "--name", name, "--entrypoint", "sleep", image, "3600")
    try:  # only what this created is removed
        docker("start", name)
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def container_tree(name: str, path: str) -> tuple[int, int]:
    """(files, bytes of content) under ``path`` in the container."""
    count = f"find {path} -type f | wc -l; find {path} -type f -print0 | xargs -0 cat | wc -c"
    out = docker("exec", "-u", "0", name, "sh", "-c", count)
    files, size = out.split()
    return int(files), int(size)


# the process's own memory ----------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@dataclass
class Memory:
    """The process's RSS around one transfer, in KiB."""

    before: int
    peak: int
    how: str  # "VmHWM" (reset before the transfer) or "ru_maxrss" (the process's high-water mark)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def measured_memory(fn: Callable[[], Any]) -> tuple[float, Any, Memory]:
    """Seconds ``fn`` took, its result, and the process's RSS before it and at its peak during it."""
    before = _status_kib("VmRSS")
    reset = _reset_peak()
    t = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t
    if reset:
        return seconds, out, Memory(before, _status_kib("VmHWM"), "VmHWM")
    return seconds, out, Memory(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


# one run ---------------------------------------------------------------------------------------------

Samples = dict[str, list[float]]  # "upload big toolcage" -> seconds


def _shell(sb: Sandbox, command: str) -> None:
    res = sb.call("run_shell", {"command": command})
    if not res.ok or not isinstance(res.result, dict) or res.result.get("exit_code") != 0:
        detail = res.result.get("stderr", "")[-2000:] if isinstance(res.result, dict) else res.error
        raise SystemExit(f"run_shell {command[:60]!r} failed: {detail}")


def _check(what: str, got: tuple[int, int], shape: str) -> None:
    want = (FILES[shape], PAYLOAD[shape])
    if got != want:
        raise SystemExit(f"{what}: {got[0]} files, {got[1]} bytes arrived; {want[0]} files, {want[1]} bytes were sent")


def one_run(
    i: int, image: str, cp: str, local: dict[str, Path], tmp: Path, samples: Samples, memory: list[dict[str, Any]]
) -> None:
    toolcage_first = i % 2 == 0
    with Sandbox(POLICY, image=image, tool="bench-transfer") as sb:
        _shell(sb, make_out("/scratch/out"))
        for shape in ("big", "small"):
            # upload -----------------------------------------------------------------------------------
            def up_toolcage(shape: str = shape) -> None:
                if shape == "big":
                    s, res, mem = measured_memory(lambda: sb.upload(local[shape], "/scratch/in"))
                    memory.append({"transfer": "upload big", "run": i, **vars(mem)})
                else:
                    s, res = timed(lambda: sb.upload(local[shape], "/scratch/in"))
                _check("toolcage upload", (res.files, res.bytes), shape)
                samples[f"upload {shape} toolcage"].append(s)
                _shell(sb, "rm -rf /scratch/in")

            def up_cp(shape: str = shape) -> None:
                s, _ = timed(lambda: docker("cp", str(local[shape]), f"{cp}:/tmp/x"))
                _check("docker cp upload", container_tree(cp, "/tmp/x"), shape)
                samples[f"upload {shape} docker cp"].append(s)
                docker("exec", "-u", "0", cp, "rm", "-rf", "/tmp/x")

            # download ---------------------------------------------------------------------------------
            remote = "big.bin" if shape == "big" else "small"

            def down_toolcage(shape: str = shape, remote: str = remote) -> None:
                dest = tmp / f"down-toolcage-{shape}"
                if shape == "big":
                    s, res, mem = measured_memory(lambda: sb.download(f"/scratch/out/{remote}", dest))
                    memory.append({"transfer": "download big", "run": i, **vars(mem)})
                else:
                    s, res = timed(lambda: sb.download(f"/scratch/out/{remote}", dest))
                _check("toolcage download", (res.files, res.bytes), shape)
                _check("toolcage download (on disk)", local_tree(dest), shape)
                samples[f"download {shape} toolcage"].append(s)
                shutil.rmtree(dest)

            def down_cp(shape: str = shape, remote: str = remote) -> None:
                dest = tmp / f"down-cp-{shape}"
                s, _ = timed(lambda: docker("cp", f"{cp}:/tmp/out/{remote}", str(dest)))
                _check("docker cp download", local_tree(dest), shape)
                samples[f"download {shape} docker cp"].append(s)
                if dest.is_dir():
                    shutil.rmtree(dest)
                else:
                    dest.unlink()

            for pair in ((up_toolcage, up_cp), (down_toolcage, down_cp)):
                for step in pair if toolcage_first else reversed(pair):
                    step()
                    print(f"\rrun {i + 1}: {step.__name__} {shape}      ", end="", file=sys.stderr, flush=True)


# the report --------------------------------------------------------------------------------------------


def summary(seconds: list[float], payload: int) -> dict[str, float]:
    med = statistics.median(seconds)
    return {
        "s_min": min(seconds),
        "s_median": med,
        "s_max": max(seconds),
        "mib_s_min": payload / MiB / max(seconds),
        "mib_s_median": payload / MiB / med,
        "mib_s_max": payload / MiB / min(seconds),
        "n": len(seconds),
    }


# issue 40: a 100 MiB file at least as fast as docker cp both ways; 10,000 small files out in half its time
GOALS = {"upload big": 1.0, "download big": 1.0, "upload small": 0.5, "download small": 0.5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.transfer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE") or DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    maxrss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    samples: Samples = {
        f"{d} {shape} {m}": []
        for d in ("upload", "download")
        for shape in ("big", "small")
        for m in ("toolcage", "docker cp")
    }
    memory: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="toolcage-bench-transfer-", dir="/tmp") as tmpdir:
        tmp = Path(tmpdir)
        local = make_local(tmp / "src")
        with plain_container(args.image) as cp:
            docker("exec", "-u", "0", cp, "sh", "-c", make_out("/tmp/out"))
            for i in range(args.runs):
                one_run(i, args.image, cp, local, tmp, samples, memory)
    print(file=sys.stderr)
    maxrss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    stats = {k: summary(v, PAYLOAD[k.split()[1]]) for k, v in samples.items()}
    ratios = {
        f"{d} {shape}": stats[f"{d} {shape} toolcage"]["s_median"] / stats[f"{d} {shape} docker cp"]["s_median"]
        for d in ("upload", "download")
        for shape in ("big", "small")
    }

    print(f"\n{'transfer':<16}{'method':<11}{'s min':>8}{'s med':>8}{'s max':>8}{'MiB/s min':>11}{'med':>8}{'max':>8}"
          f"{'toolcage/cp':>13}")  # fmt: skip
    for key, s in stats.items():
        d, shape, method = key.split(" ", 2)
        ratio = f"{ratios[f'{d} {shape}']:.2f}x" if method == "toolcage" else ""
        print(
            f"{d + ' ' + shape:<16}{method:<11}{s['s_min']:>8.3f}{s['s_median']:>8.3f}{s['s_max']:>8.3f}"
            f"{s['mib_s_min']:>11.1f}{s['mib_s_median']:>8.1f}{s['mib_s_max']:>8.1f}{ratio:>13}"
        )
    print(
        f"\nbig = 1 file of {BIG_BYTES // MiB} MiB; small = {SMALL_FILES:,} files of {SMALL_BYTES} B in {SMALL_DIRS} "
        f"directories ({PAYLOAD['small'] / MiB:.1f} MiB); {args.runs} runs; toolcage/cp = ratio of the median times"
    )
    for d in ("upload", "download"):
        for m in ("toolcage", "docker cp"):
            print(f"{d} small {m}: {SMALL_FILES / stats[f'{d} small {m}']['s_median']:,.0f} files/s (median)")
    print("\nissue 40's goals (toolcage's median time over docker cp's, same run):")
    for key, goal in GOALS.items():
        verdict = "PASS" if ratios[key] <= goal else "MISS"
        print(f"  {key:<16}{ratios[key]:>6.2f}x  goal <= {goal:.2f}x  {verdict}")
    for rss in memory:
        print(
            f"RSS of this process, toolcage {rss['transfer']} (run {rss['run'] + 1}): "
            f"{rss['before'] / 1024:.1f} MiB before, {rss['peak'] / 1024:.1f} MiB peak during ({rss['how']}), "
            f"+{(rss['peak'] - rss['before']) / 1024:.1f} MiB"
        )
    print(f"ru_maxrss of this process: {maxrss_start / 1024:.1f} MiB at start, {maxrss_end / 1024:.1f} MiB at the end")

    if args.json is not None:
        engine_version = docker("version", "--format", "{{.Server.Version}}").strip()
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "docker": engine_version},
            "image": args.image,
            "image_id": docker("image", "inspect", "--format", "{{.Id}}", args.image).strip(),
            "toolcage": os.path.dirname(toolcage.__file__),
            "runs": args.runs,
            "payload_bytes": PAYLOAD,
            "files": FILES,
            "policy": POLICY,
            "stats": stats,
            "ratio_toolcage_over_docker_cp_median_time": ratios,
            "goals": {k: {"ratio_at_most": g, "pass": ratios[k] <= g} for k, g in GOALS.items()},
            "samples_s": samples,
            "rss_kib": memory,
            "ru_maxrss_kib": {"start": maxrss_start, "end": maxrss_end},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
