"""Background processes and terminals (issue 37, points 1-3): spawn on pipes and on a terminal, read output
since a cursor, wait for output/port/exit, stdin, signals, a process living across calls and dying with the
sandbox, and unsafe_background_processes doing what it says. Under runc and gVisor.

One sandbox serves the module; the tests that close theirs, or need another policy, make their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import foreign_images
from toolcage import AsyncSandbox, Sandbox, load_policy
from toolcage.errors import ProcessError


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox() as box:
        yield box


ECHO = (
    "import sys\nprint('ready', flush=True)\n"
    "for line in sys.stdin:\n    print('got', line.strip(), flush=True)\nprint('bye')\n"
)


def test_pipes_cursor_stdin_wait_list_and_reattach(sb: Sandbox) -> None:
    sb.write_files({"/scratch/echo.py": ECHO})
    p = sb.spawn(argv=["python3", "/scratch/echo.py"], name="echo")
    assert p.wait(output="ready", timeout=15)
    first = p.read()
    assert first.text == "ready\n" and first.running and first.cursor == 6
    assert p.write("one\n") == 4
    assert p.wait(output="got one", since=first.cursor, timeout=10)
    # a second client: a handle by id reads from any cursor it kept, or from 0
    again = sb.process(p.id)
    assert again.read(since=0).text == "ready\ngot one\n"
    assert again.read(since=first.cursor).text == "got one\n"
    entry = next(e for e in sb.processes() if e["id"] == p.id)
    assert entry["state"] == "running" and entry["stdin_open"] and entry["pty"] is False
    p.close_stdin()
    assert p.wait(timeout=10)
    out = p.read()
    assert out.text == "got one\nbye\n" and out.state == "exited" and out.exit_code == 0, out
    with pytest.raises(ProcessError):
        p.write("late\n")


def test_signal_kill_and_port(sb: Sandbox) -> None:
    trap = sb.spawn("trap 'echo caught; exit 3' TERM; echo armed; while :; do sleep 0.1; done")
    assert trap.wait(output="armed", timeout=10)
    trap.signal("SIGTERM")
    assert trap.wait(timeout=10)
    out = trap.read(since=0)
    assert "caught" in out.text and out.exit_code == 3, out
    srv = sb.spawn("exec python3 -m http.server 8123 --bind 127.0.0.1")
    assert srv.wait(port=8123, timeout=15)
    assert not srv.wait(output="never-printed", timeout=0.5)
    got = srv.kill()
    assert got["state"] == "exited" and got["signal"] == "SIGKILL", got
    with pytest.raises(ProcessError):
        sb.process(99999).read()


def test_a_process_outlives_calls_and_so_does_its_background_job(sb: Sandbox) -> None:
    sh = sb.spawn("sh")
    sh.write("sleep 300 & echo job=$!\n")
    assert sh.wait(output=r"job=\d+", timeout=10)
    for _ in range(3):  # calls in between: their sweep keeps the background process and its children
        assert sb.call("run_python", {"code": "print(6*7)"}).result["stdout"] == "42\n"
        assert sb.call("run_shell", {"command": "sleep 0.2 & echo x"}).ok
    cur = sh.cursor
    sh.write('kill -0 $! && echo "alive $!"\n')
    assert sh.wait(output="alive", since=cur, timeout=10), sh.read(since=0)
    assert sh.read(since=0).running
    sh.kill()


def test_a_terminal_python_repl(sb: Sandbox) -> None:
    repl = sb.spawn("python3 -i -q", pty=(30, 100))
    assert repl.wait(output=">>> ", timeout=15)
    repl.write("6*7\r")
    assert repl.wait(output=r"\b42\b", timeout=10)
    repl.write("while True: pass\r\r")
    time.sleep(0.5)
    repl.write("\x03")  # Ctrl-C
    assert repl.wait(output="KeyboardInterrupt", timeout=10), repl.read(since=0)
    assert repl.wait(output="30 100", timeout=0.1) is False
    repl.write("import os; os.system('stty size')\r")
    assert repl.wait(output=r"30 100\r?\n", timeout=10), repl.read(since=0)
    repl.resize(40, 120)
    repl.write("os.system('stty size')\r")
    assert repl.wait(output=r"40 120\r?\n0\r?\n>>> ", timeout=10), repl.read(since=0)  # back at the prompt
    repl.write("\x04")  # Ctrl-D
    assert repl.wait(timeout=10), repl.read(since=0)
    # CPython's REPL exits by SIGINT after an interrupt it handled (its own quirk, not the sandbox's)
    assert repl.read().exit_code in (0, -2)
    with pytest.raises(ProcessError):
        sb.spawn("true").resize(10, 10)  # no terminal


def test_a_terminal_shell_with_job_control(sb: Sandbox) -> None:
    sh = sb.spawn(argv=["sh", "-i"], pty=True)
    sh.write("sleep 200 &\rjobs\r")
    assert sh.wait(output=r"\[1\]", timeout=10), sh.read(since=0)
    sh.write("kill %1; echo done-$((40+2))\r")
    assert sh.wait(output="done-42", timeout=10), sh.read(since=0)
    sh.write("exit\r")
    assert sh.wait(timeout=10)


def test_the_cursor_never_splits_a_character(sb: Sandbox) -> None:
    p = sb.spawn("python3 -c \"print('é€😀' * 300, end='')\"")
    assert p.wait(timeout=10)
    chunks, since = [], 0
    total = len(("é€😀" * 300).encode())
    for size in [1, 2, 3, 5, 7, 64] * 200:
        if since >= total:
            break
        out = p.read(since=since, max_bytes=size)
        if out.data:
            chunks.append(out.data.decode("utf-8"))  # each chunk whole characters: no UnicodeDecodeError
        since = out.cursor
    assert "".join(chunks) == "é€😀" * 300


def test_over_a_mebibyte_of_output_drops_the_oldest(sb: Sandbox) -> None:
    p = sb.spawn("python3 -c \"import sys; sys.stdout.write('x' * (3 << 19)); sys.stdout.write('END')\"")
    assert p.wait(timeout=20)
    out = p.read(since=0, max_bytes=1 << 20)
    assert out.dropped > 0 and out.dropped + len(out.data) <= (3 << 19) + 3, (out.dropped, len(out.data))
    tail = p.read(since=out.cursor, max_bytes=1 << 20)
    assert (out.data + tail.data).endswith(b"END") and len(out.data + tail.data) <= 1 << 20


def test_it_dies_with_the_sandbox(engine: Any) -> None:
    with Sandbox() as box:
        p = box.spawn("sleep 600")
        assert p.read().running
        cid = box.container_id
    assert cid
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ps = subprocess.run(
            ["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={cid}"], capture_output=True, text=True
        )
        if not ps.stdout.strip():
            break
        time.sleep(0.5)
    assert not ps.stdout.strip(), f"container {cid} outlived its sandbox"


TICK = "while :; do date +%s%N > /scratch/{0}.t; mv /scratch/{0}.t /scratch/{0}; sleep 0.1; done"


def test_unsafe_background_processes_keep_cmd_and_nohup(engine: Any) -> None:
    """With unsafe_background_processes, `cmd &` and `nohup cmd &` survive their call (they died before)."""
    policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=True)
    with Sandbox(policy, tool="bg-unsafe") as box:
        r = box.call(
            "run_shell",
            {"command": f"sh -c '{TICK.format('a')}' & nohup sh -c '{TICK.format('b')}' >/dev/null 2>&1 & sleep 0.3"},
        )
        assert r.ok, r
        look = "cat /scratch/a /scratch/b"
        before = box.call("run_shell", {"command": look}).result["stdout"].split()
        time.sleep(1)
        after = box.call("run_shell", {"command": look}).result["stdout"].split()
        assert len(after) == 2 and all(int(x) > int(y) for x, y in zip(after, before, strict=True)), (before, after)


def test_async_sandbox_spawn(engine: Any) -> None:
    async def go() -> None:
        async with AsyncSandbox() as box:
            p = await box.spawn('read line; echo "hello $line"')
            await p.write("world\n")
            assert await p.wait(timeout=10)
            out = await p.read()
            assert out.text == "hello world\n" and out.exit_code == 0
            q = await box.spawn("sleep 100")
            listed = await box.processes()
            assert {e["id"] for e in listed} >= {p.id, q.id}
            assert (await q.kill())["signal"] == "SIGKILL"

    asyncio.run(go())


def test_a_foreign_busybox_image(engine: Any) -> None:
    """A foreign image with no python of its own: its sh on pipes and on a terminal."""
    try:
        image = foreign_images.ensure("busybox")
    except foreign_images.BuildError as exc:
        pytest.fail(f"the busybox image cannot be built here: {exc}", pytrace=False)
    with Sandbox(image=image) as box:
        p = box.spawn("read x; echo got-$x")
        p.write("it\n")
        assert p.wait(timeout=15) and p.read().text == "got-it\n"
        term = box.spawn(argv=["sh", "-i"], pty=(20, 60))
        term.write("stty size; echo end-$((1+1))\r")
        assert term.wait(output="end-2", timeout=15), term.read(since=0)
        assert "20 60" in term.read(since=0).text
        term.kill()
