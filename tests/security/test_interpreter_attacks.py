"""Attacks through the Python interpreter's contexts (issue 38): a cell that will not stop, one that blows the
sandbox's memory, one that prints forever, one that displays 10,000 images, messages forged straight onto the
context's channel (a huge line, unknown MIME types, JSON nested past any parser's stack), the 17th context,
and nothing outliving the run.

Each test is the attack as a cell would run it, on the real engine, under runc and gVisor. What a context's
results say is the cell's to forge (the shell runs in its process): the bounds hold whatever it sends.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox, load_policy
from toolcage.errors import InterpreterError

pytestmark = pytest.mark.usefixtures("no_leaks")

CAP = 64 * 1024  # the module sandbox's output_cap: a value may be 4x, a cell's results 8x, a line 4x + 64 KiB


def _policy(memory: int | None = None) -> Any:
    base = load_policy("default")
    limits = dataclasses.replace(base.limits, output_cap=CAP, memory=memory or base.limits.memory)
    return dataclasses.replace(base, limits=limits, timeouts=dataclasses.replace(base.timeouts, run_s=600, idle_s=300))


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(_policy(), tool="interp-attacks") as box:
        yield box


@pytest.fixture
def ctx(sb: Sandbox) -> Iterator[Any]:
    c = sb.create_code_context()
    yield c
    sb.remove_code_context(c)


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


DEAF = """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
"""
STUBBORN = """
while True:
    try:
        while True:
            pass
    except KeyboardInterrupt:
        pass
"""


@pytest.mark.parametrize("cell", [DEAF, STUBBORN], ids=["sigint-ignored", "keyboardinterrupt-caught"])
def test_a_cell_that_will_not_stop_is_killed_and_its_context_reset(sb: Sandbox, ctx: Any, cell: str) -> None:
    sb.run_code("kept = 1", ctx)
    started = time.monotonic()
    ex = sb.run_code(cell, ctx, timeout=1)
    took = time.monotonic() - started
    assert ex.status == "reset" and ex.timed_out, ex
    assert ex.error is not None and ex.error.name == "TimeoutError", ex.error
    assert took < 10, took  # the timeout, the interrupt's grace (2 s), the kill
    after = sb.run_code("'kept' in dir()", ctx)
    assert after.status == "ok" and after.text == "False" and after.restarted, after  # a fresh state
    assert after.execution_count == 1, after


def test_a_cell_past_the_memory_limit_resets_its_context_and_the_sandbox_lives_on(engine: Any) -> None:
    with Sandbox(_policy(memory=256 << 20), tool="interp-oom") as box:
        box.run_code("kept = 1")
        ex = box.run_code("hog = []\nwhile True:\n    hog.append(b'x' * (16 << 20))", timeout=60)
        assert ex.status == "reset" and not ex.timed_out, ex
        assert ex.error is not None and ex.error.name == "ContextDied", ex.error
        assert "SIGKILL" in ex.error.value, ex.error
        shell = box.call("run_shell", {"command": "echo alive"})
        assert shell.ok and shell.result["stdout"] == "alive\n", shell
        after = box.run_code("'kept' in dir()")
        assert after.text == "False" and after.restarted, after


def test_a_cell_printing_forever_is_cut_at_the_output_cap(sb: Sandbox, ctx: Any) -> None:
    before = _rss_kib()
    streamed: list[str] = []
    ex = sb.run_code("while True:\n    print('x' * 1023)", ctx, timeout=3, on_stdout=streamed.append)
    assert ex.status in ("interrupted", "reset") and ex.timed_out and ex.truncated, (ex.status, ex.error)
    kept = sum(len(s.encode()) for s in ex.logs.stdout + ex.logs.stderr)
    assert CAP // 2 <= kept <= CAP, kept
    assert sum(len(s.encode()) for s in streamed) <= CAP, "the stream went past the cap"
    assert _rss_kib() - before < 32 * 1024, "the runner grew with the cell's output"
    assert sb.run_code("1 + 1", ctx).text == "2"


def test_ten_thousand_images_give_at_most_100_results(sb: Sandbox, ctx: Any) -> None:
    code = (
        "from IPython.display import display, Image\n"
        "png = b'\\x89PNG\\r\\n\\x1a\\n' + b'\\0' * 64\n"
        "for _ in range(10000):\n"
        "    display(Image(data=png, format='png'))\n"
    )
    ex = sb.run_code(code, ctx, timeout=60)
    assert ex.status == "ok", (ex.status, ex.error)
    assert len(ex.results) == 100 and ex.dropped.get("results") == 9900, (len(ex.results), ex.dropped)


# the channel's write end, as the shell keeps it (pyshell's _OUT): any cell can find and write it
OUT = (
    "import gc, json, os\n"
    "_OUT = next(d for d in gc.get_objects() if type(d) is dict and '_send_lock' in d and '_OUT' in d)['_OUT']\n"
    "def forge(line):\n"
    "    view = memoryview(line)\n"
    "    while view:\n"
    "        view = view[os.write(_OUT, view):]\n"
)


def test_forged_huge_lines_and_unknown_mime_types_are_dropped(sb: Sandbox, ctx: Any) -> None:
    code = OUT + (
        # a stream line far past the line bound (4 x CAP + 64 KiB), then one just inside it
        "forge(json.dumps({'t': 'stream', 'name': 'stdout', 'text': 'H' * (8 << 20)}).encode() + b'\\n')\n"
        "forge(json.dumps({'t': 'display', 'main': True, 'data': {'text/plain': 'v' * (4 * 65536 - 2)}}).encode()"
        " + b'\\n')\n"
        "forge(json.dumps({'t': 'display', 'data': {'text/html': 'w' * (4 * 65536 + 10)}}).encode() + b'\\n')\n"
        "for i in range(50):\n"
        "    forge(json.dumps({'t': 'display', 'main': False, 'data': {\n"
        "        'application/x-evil': 'x', 'text/x-shellscript': 'rm -rf /', 'text/plain': str(i)}}).encode()"
        " + b'\\n')\n"
        "forge(json.dumps({'t': 'display', 'data': {'image/png': 12}}).encode() + b'\\n')\n"
        "forge(b'{\"t\": \"no-such-kind\"}\\n' + b'not json at all\\n')\n"
        "print('after')\n"
    )
    before = _rss_kib()
    ex = sb.run_code(code, ctx, timeout=30)
    assert ex.status == "ok" and ex.error is None, ex.error
    assert ex.logs.stdout == ["after\n"], [s[:40] for s in ex.logs.stdout]  # the huge line skipped whole
    allowed = {"text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript"}
    for r in ex.results:
        assert set(r.formats()) <= allowed and not r.extra, r
    first, *rest = ex.results
    assert first.is_main_result and first.html is None and len(first.text or "") == 4 * 65536 - 2
    assert [r.text for r in rest] == [str(i) for i in range(50)]
    assert ex.dropped == {"values": 2, "mime_types": 100, "messages": 1}, ex.dropped
    assert _rss_kib() - before < 64 * 1024, "the runner grew with the forged lines"
    assert sb.run_code("'ok'", ctx).text == "'ok'"


def test_forged_json_nested_past_the_stack_is_dropped(sb: Sandbox, ctx: Any) -> None:
    """JSON nested about a thousand deep is a few KB and breaks a recursive parser or encoder: the worker's
    json.loads, or its answer's json.dumps (before the fix: code_run failed with 'Internal error', and the
    context's next cell got this cell's answer, one behind from then on). Lines nested past 64 are dropped,
    the cell's own answer comes back, and the next cell gets its own."""
    forged = []
    for depth in (20, 200, 990, 995, 1100, 100_000):
        nest = f"'[' * {depth} + ']' * {depth}"
        forged += [
            f'forge(b\'{{"t": "display", "data": {{"application/json": \' + ({nest}).encode() + b\'}}}}\\n\')',
            f'forge(b\'{{"t": "error", "name": \' + ({nest}).encode() + b\'}}\\n\')',
        ]
    code = OUT + "\n".join(forged) + "\nprint('after')\n"
    ex = sb.run_code(code, ctx, timeout=30)
    assert ex.logs.stdout == ["after\n"] and ex.execution_count == 1, ex
    (kept,) = ex.results  # the one nested 20 deep: within the bound (64), as are the error's fields
    assert json.dumps(kept.json) == "[" * 20 + "]" * 20, kept
    assert ex.error is not None and ex.error.name == "[" * 20 + "]" * 20, ex.error
    nxt = sb.run_code("40 + 2", ctx)
    assert nxt.status == "ok" and nxt.text == "42" and nxt.execution_count == 2, nxt


def test_the_17th_context_is_refused(engine: Any) -> None:
    policy = _policy(memory=2 << 30)
    policy = dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, pids=256))
    with Sandbox(policy, tool="interp-17") as box:
        made = [box.create_code_context() for _ in range(16)]
        assert len({c.id for c in made}) == 16
        with pytest.raises(InterpreterError, match="at most 16"):
            box.create_code_context()
        with pytest.raises(InterpreterError, match="at most 16"):
            box.run_code("1")  # the default context is one more
        box.remove_code_context(made[0])
        assert box.run_code("'room again'").text == "'room again'"
        # a cell running when the sandbox closes: no_leaks checks that nothing of the run is left
        assert box.run_code("import subprocess\nsubprocess.Popen(['sleep', '600'])\n1", made[1]).text == "1"


def test_nothing_outlives_the_run(engine: Any) -> None:
    with Sandbox(_policy(), tool="interp-close") as box:
        box.run_code("import subprocess\np = subprocess.Popen(['sleep', '600'])")
        ctx = box.create_code_context()
        busy = box.run_code(DEAF, ctx, timeout=0.5)
        assert busy.status == "reset", busy
        box.run_code("x = 1", ctx)
        shells = {p["name"]: p["state"] for p in box.processes() if p["name"].startswith("python context")}
        assert list(shells.values()).count("running") == 2, shells  # the default and ctx's fresh one
    # no_leaks: the container (and with it every context's process) is gone


CROSS = r"""
import json, os
hit = []
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        if b'pyshell' not in open(f'/proc/{pid}/cmdline', 'rb').read():
            continue
        fd = os.open(f'/proc/{pid}/fd/3', os.O_WRONLY | os.O_NONBLOCK)  # the other shell's channel
        os.write(fd, json.dumps({'t': 'stream', 'name': 'stdout', 'text': 'PWNED\n'}).encode() + b'\n')
        hit.append(pid)
    except OSError as exc:
        hit.append(f'{pid}:{exc.errno}')
hit
"""


def test_one_context_forging_anothers_results(sb: Sandbox, ctx: Any) -> None:
    """Contexts keep state apart, not secrets (docs/security.md). Under gVisor each has a PID namespace of its
    own: a context opens no other shell's channel. Under runc every context runs as the run's one uid and
    writes into another's channel through /proc/PID/fd (one run's code must trust itself); the runc branch pins
    the known behaviour, and the victim's answer stays within its bounds."""
    victim = sb.create_code_context()
    try:
        sb.run_code("secret = 's3'", victim)
        ex = sb.run_code(CROSS, ctx)
        assert ex.status == "ok", ex.error
        got = sb.run_code("len(secret)", victim)
        assert got.status == "ok" and got.text == "2", got
        if sb.kind == "gvisor":
            # it sees only its own namespace (its keeper, PID 1, names pyshell): no channel opened
            assert ":" in (ex.text or "") and got.logs.stdout == [], (ex.text, got.logs)
            assert "PWNED" not in "".join(got.logs.stdout), got.logs
        else:
            assert got.logs.stdout == ["PWNED\n"], f"the runc premise changed: {ex.text} {got.logs}"
    finally:
        sb.remove_code_context(victim)
