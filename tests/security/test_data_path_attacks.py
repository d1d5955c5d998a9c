"""The data path (issue 40) attacked from inside, on the real engine (runc and gVisor passes).

Files now travel as raw data frames on the protocol stream (toolcage.worker.protocol), so the stream carries
bytes the sandbox chose. What must hold: tool code cannot write a frame into the channel; a worker in the
sandbox's hands (simulated: the runner's parser handed its bytes, as test_channel's stray message is) cannot
make the runner take a frame nobody asked for, a larger one, or one tied to another message; bytes that look
like the protocol inside a file arrive as they were.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage import ProtocolError, Sandbox
from toolcage.worker.protocol import FRAME_MAX

pytestmark = pytest.mark.usefixtures("no_leaks")

FORGE_FRAME = r"""
import json, os, errno
# a frame header, its bytes and an answer naming it, for every id a runner could be waiting for
blob = b"=4\nEVIL" + b"".join(
    json.dumps({"jsonrpc": "2.0", "id": i, "result": {"stream": "s", "frame": 4, "done": True}}).encode() + b"\n"
    for i in range(1, 200)
)
seen = {}
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:
        with open(f"/proc/{pid}/fd/1", "wb", buffering=0) as f:
            f.write(blob)
        seen[pid] = "written"
    except OSError as e:
        seen[pid] = errno.errorcode[e.errno]
print(json.dumps({"init": seen.get("1")}))
"""


def test_tool_code_cannot_write_a_frame_into_the_channel(engine: Any, tmp_path: Path) -> None:
    """Frames written to the worker's stdout from a call are refused; the next download is the real file."""
    with Sandbox(tool="frame-forge") as sb:
        r = sb.call("run_python", {"code": FORGE_FRAME})
        assert r.status == "ok", r.result
        assert json.loads(r.result["stdout"]) == {"init": None if sb.kind == "gvisor" else "EACCES"}
        sb.write_files({"real.txt": "real\n"})
        sb.download("/scratch/real.txt", tmp_path / "out")
    assert (tmp_path / "out" / "real.txt").read_text() == "real\n"


@pytest.mark.parametrize("attack", ["unasked", "oversized", "wrong_size"])
def test_a_hostile_workers_frame_kills_the_sandbox(engine: Any, attack: str) -> None:
    """A frame no call asked for, one over FRAME_MAX while a download waits, one whose answer names another
    size: the sandbox is killed at once with a ProtocolError that says so."""
    with Sandbox(tool="frame-hostile") as sb:
        parser = sb._run.session.parser
        assert parser is not None
        if attack != "unasked":
            parser.expect("dl-1", frame=True)  # a download's chunk in flight (as Session.request expects it)
        data = {
            "unasked": b"=3\nabc",
            "oversized": b"=%d\n" % (FRAME_MAX + 1),
            "wrong_size": b'=3\nabc{"jsonrpc": "2.0", "id": "dl-1", "result": {"frame": 2, "done": true}}\n',
        }[attack]
        parser.stdout(data)
        time.sleep(0.5)
        assert not engine.inspect(sb.container_id)["State"]["Running"]
        with pytest.raises(ProtocolError, match="data frame"):
            sb.call("ping")


def test_protocol_lookalike_bytes_cross_both_ways_intact(engine: Any, tmp_path: Path) -> None:
    """A file made of frame headers, newlines and JSON answers (over several chunks) goes in and comes back
    byte for byte: a frame is read by its size, never scanned."""
    unit = b'=8388608\n{"jsonrpc": "2.0", "id": 1, "result": {"frame": 3}}\n\x00\xff=3\n'
    body = unit * ((5 << 20) // len(unit))
    src = tmp_path / "in"
    src.mkdir()
    (src / "look.bin").write_bytes(body)
    with Sandbox({"limits": {"scratch": "64m"}}, tool="frame-lookalike") as sb:
        sb.upload(src, "/scratch/in")
        r = sb.call("run_shell", {"command": "sha256sum /scratch/in/look.bin"})
        assert r.result["stdout"].split()[0] == hashlib.sha256(body).hexdigest()
        sb.download("/scratch/in/look.bin", tmp_path / "out")
    assert (tmp_path / "out" / "look.bin").read_bytes() == body
