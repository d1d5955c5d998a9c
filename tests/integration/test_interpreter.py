"""The stateful Python interpreter from the host (issue 38, points 1-3): ``Sandbox.run_code`` and its contexts.

State persists across calls (variables, imports, an open file); contexts are kept apart and can be created,
listed, restarted (fresh state, same id) and removed; the last expression is the main result; display() of
HTML, a PNG and JSON come back as their MIME types; an exception is the cell's error and the context keeps its
variables; stdout and stderr are logged and streamed; a timeout interrupts with KeyboardInterrupt and keeps the
state; AsyncSandbox does the same. Under runc and gVisor.

One sandbox serves the module (its contexts are named per test, so the tests do not meet); the async test and
the data image's test make their own.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage import AsyncSandbox, Sandbox, load_policy
from toolcage.errors import InterpreterError

DATA_IMAGE = os.environ.get("TOOLCAGE_DATA_IMAGE", "toolcage-data:dev")  # as tests/integration/test_data_agent_example


def _policy() -> Any:
    base = load_policy("default")
    return dataclasses.replace(base, timeouts=dataclasses.replace(base.timeouts, run_s=600, idle_s=300))


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(_policy(), tool="interp") as box:
        yield box


def _png(width: int = 2, height: int = 1) -> bytes:
    """A small, valid PNG (RGB, one colour)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_state_persists_across_calls(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    first = sb.run_code("import json\nx = 41\nf = open('/scratch/kept.txt', 'w')\nf.write('one ')", ctx)
    assert first.status == "ok" and first.error is None, first
    later = sb.run_code("x += 1\nf.write('two')\nf.close()\njson.dumps({'x': x})", ctx)
    assert later.status == "ok" and later.text == "'{\"x\": 42}'", later
    assert sb.run_code("open('/scratch/kept.txt').read()", ctx).text == "'one two'"
    sb.remove_code_context(ctx)


def test_contexts_apart_create_list_restart_remove(sb: Sandbox) -> None:
    a = sb.create_code_context()
    assert sb.call("run_shell", {"command": "mkdir -p /scratch/sub"}).ok
    b = sb.create_code_context(cwd="/scratch/sub")
    assert a.id != b.id and a.language == "python" and b.cwd == "/scratch/sub", (a, b)
    sb.run_code("secret = 'a'", a)
    ex = sb.run_code("secret", b)
    assert ex.status == "error" and ex.error is not None and ex.error.name == "NameError", ex
    assert sb.run_code("import os; os.getcwd()", b).text == "'/scratch/sub'"
    ids = {c.id for c in sb.list_code_contexts()}
    assert {a.id, b.id} <= ids, ids
    sb.restart_code_context(a)
    again = sb.run_code("'secret' in dir()", a)
    assert again.text == "False" and again.execution_count == 1, again  # fresh state, same id
    sb.remove_code_context(a)
    sb.remove_code_context(b)
    assert not {a.id, b.id} & {c.id for c in sb.list_code_contexts()}
    with pytest.raises(InterpreterError, match="no Python context"):
        sb.run_code("1", a)


def test_results_main_html_png_json(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    png = _png()
    code = (
        "from IPython.display import display, HTML, Image, JSON\n"
        "display(HTML('<b>bold</b>'))\n"
        f"display(Image(data={png!r}))\n"
        "display(JSON({'a': [1, 2]}))\n"
        "6 * 7\n"
    )
    seen: list[Any] = []
    ex = sb.run_code(code, ctx, on_result=seen.append)
    assert ex.status == "ok" and ex.error is None, ex
    html, image, js, main = ex.results
    assert html.html == "<b>bold</b>" and not html.is_main_result, html
    assert image.png is not None and base64.b64decode(image.png) == png, image
    assert js.json == {"a": [1, 2]}, js
    assert main.is_main_result and main.text == "42" and ex.text == "42", main
    assert seen == ex.results
    sb.remove_code_context(ctx)


def test_an_exception_keeps_the_context_and_counts_go_on(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    assert sb.run_code("kept = [1, 2]", ctx).execution_count == 1
    errors: list[Any] = []
    ex = sb.run_code("def boom():\n    raise ValueError('bad input')\nboom()", ctx, on_error=errors.append)
    assert ex.status == "error" and ex.execution_count == 2 and ex.results == [], ex
    assert ex.error is not None and ex.error.name == "ValueError" and ex.error.value == "bad input", ex.error
    assert "boom()" in ex.error.traceback and "ValueError" in ex.error.traceback, ex.error.traceback
    assert errors == [ex.error]
    after = sb.run_code("len(kept)", ctx)
    assert after.status == "ok" and after.text == "2" and after.execution_count == 3, after
    sb.remove_code_context(ctx)


def test_stdout_and_stderr_logged_and_streamed(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    out: list[str] = []
    err: list[str] = []
    code = "import sys, subprocess\nprint('hello')\nprint('oops', file=sys.stderr)\nsubprocess.run(['echo', 'child'])"
    ex = sb.run_code(code, ctx, on_stdout=out.append, on_stderr=err.append)
    assert ex.status == "ok", ex
    assert "".join(ex.logs.stdout) == "hello\nchild\n" and "".join(ex.logs.stderr) == "oops\n", ex.logs
    assert "".join(out) == "hello\nchild\n" and "".join(err) == "oops\n", (out, err)
    sb.remove_code_context(ctx)


def test_a_timeout_interrupts_and_keeps_the_state(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    sb.run_code("n = 0", ctx)
    ex = sb.run_code("import time\nwhile True:\n    n += 1\n    time.sleep(0.01)", ctx, timeout=1.5)
    assert ex.status == "interrupted" and ex.timed_out, ex
    assert ex.error is not None and ex.error.name == "KeyboardInterrupt", ex.error
    after = sb.run_code("n > 0", ctx)
    assert after.status == "ok" and after.text == "True" and not after.restarted, after
    sb.remove_code_context(ctx)


def test_the_default_context_and_async_sandbox(engine: Any) -> None:
    async def go() -> None:
        async with AsyncSandbox(tool="interp-async") as box:
            first = await box.run_code("y = 2")
            assert first.context == "default" and first.status == "ok", first
            ex = await box.run_code("y ** 10")
            assert ex.text == "1024" and ex.execution_count == 2, ex
            ctx = await box.create_code_context()
            assert ctx.id in {c.id for c in await box.list_code_contexts()}
            await box.restart_code_context(ctx)
            await box.remove_code_context(ctx)

    asyncio.run(go())


@pytest.fixture(scope="module")
def data_image(engine: Any) -> str:
    """The image with pandas and matplotlib, built (from the worker image, both from PyPI) if this engine lacks
    it; the same tag as the data agent example's test, so CI builds it once for both."""
    have = subprocess.run(["docker", "image", "inspect", DATA_IMAGE], capture_output=True, check=False)
    if have.returncode != 0:
        build = subprocess.run(
            [sys.executable, "-m", "toolcage.cli", "image", "build", "--pip", "pandas", "--pip", "matplotlib",
             "--tag", DATA_IMAGE],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert build.returncode == 0, f"could not build {DATA_IMAGE}:\n{build.stderr[-3000:]}"
    return DATA_IMAGE


def test_an_open_figure_gives_a_png_and_a_dataframe_html(data_image: str) -> None:
    with Sandbox(_policy(), image=data_image, tool="interp-data") as box:
        ex = box.run_code(
            "import pandas as pd, matplotlib.pyplot as plt\n"
            "df = pd.DataFrame({'k': ['a', 'b'], 'v': [3, 5]})\n"
            "plt.plot(df.v)\n"
            "df\n",
            timeout=120,
        )
        assert ex.status == "ok" and ex.error is None, ex
        table = next(r for r in ex.results if r.is_main_result)
        assert table.html is not None and "<table" in table.html and "a" in (table.text or ""), table
        (chart,) = [r for r in ex.results if r.png is not None]
        assert base64.b64decode(chart.png).startswith(b"\x89PNG\r\n\x1a\n") and not chart.is_main_result, chart
        assert box.run_code("int(df.v.sum())").text == "8"  # the DataFrame persists
