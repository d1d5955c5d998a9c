"""``python3 pyshell.py``: one Python context of the interpreter (``worker.tools.interpreter``), an IPython shell.

Stand-alone on purpose: it runs with the image's own Python (a user's image: its packages; the worker image:
the packages ``toolcage image build --pip`` added), imports only the standard library and IPython (the
image's own, or the worker image's copy at the end of its ``PYTHONPATH``), and nothing of toolcage.

Its stdin and stdout are the worker's channel, one JSON object per line. It takes ``{"code": ...}`` and
answers with, in order: ``stream`` (``name`` stdout or stderr, ``text``) as the cell writes, ``display``
(``data``: a MIME bundle, ``main``: the value of the cell's last expression), ``clear``, ``error`` (``name``,
``value``, ``traceback``), then ``done`` (``execution_count``). First of all it says ``ready`` (the Python and
IPython versions), or ``fatal`` (why it cannot serve: IPython missing) and exits.

The cell's own stdin is /dev/null; its fds 1 and 2 are pipes this process reads on a thread of its own, so
the output of what the cell starts (``!ls``, ``subprocess``, a C library's printf) is the cell's too. Nothing
here is trusted by the worker: the cell can write to the channel as well as this code can, so the worker
bounds and checks every message (``worker.tools.interpreter``). SIGINT stops the running cell with a
``KeyboardInterrupt``; the context keeps its variables. Matplotlib's figures are shown inline (PNG) at the
end of each cell, without ``savefig``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import sys
import threading
from typing import Any

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's directory holds the worker's modules: not the context's to import

_OUT = os.dup(1)  # the channel's write end, before fd 1 becomes the cell's stdout pipe
_IN = os.fdopen(os.dup(0), "rb", buffering=0)
_send_lock = threading.Lock()


def send(msg: dict[str, Any]) -> None:
    line = (json.dumps(msg, default=repr, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with _send_lock:
        view = memoryview(line)
        while view:
            view = view[os.write(_OUT, view) :]


class _Capture:
    """fds 1 and 2 as pipes, read on one thread and sent as ``stream`` messages; ``drain()`` returns once
    everything written so far has been sent (the end of a cell)."""

    def __init__(self) -> None:
        self.fds: dict[int, str] = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.fds[r] = name
        self.wake_r, self.wake_w = os.pipe()
        self.done = threading.Event()
        threading.Thread(target=self._loop, name="capture", daemon=True).start()

    def _read(self, fds: list[int]) -> None:
        for fd in fds:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except (BlockingIOError, InterruptedError):
                    break
                if not chunk:
                    break
                send({"t": "stream", "name": self.fds[fd], "text": chunk.decode("utf-8", "replace")})
                if len(chunk) < 65536:
                    break

    def _loop(self) -> None:
        watched = [*self.fds, self.wake_r]
        while True:
            ready, _, _ = select.select(watched, [], [])
            self._read([fd for fd in ready if fd != self.wake_r])
            if self.wake_r in ready:
                os.read(self.wake_r, 64)
                while True:  # everything written before drain() was called is in the pipes now
                    more, _, _ = select.select(list(self.fds), [], [], 0)
                    if not more:
                        break
                    self._read(more)
                self.done.set()

    def drain(self) -> None:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a cell may have replaced them with anything
                f.flush()
        self.done.clear()
        os.write(self.wake_w, b"x")
        self.done.wait(5.0)


def _jsonable(mime: str, value: object) -> object:
    if isinstance(value, bytes | bytearray):
        return (
            base64.b64encode(value).decode("ascii")
            if mime.startswith(("image/", "application/pdf"))
            else (bytes(value).decode("utf-8", "replace"))
        )
    return value


def _bundle(data: dict[str, Any]) -> dict[str, Any]:
    return {str(k): _jsonable(str(k), v) for k, v in (data or {}).items()}


def _ipython_dir() -> str:
    """Where IPython may write its profile while it starts (removed once it has): /dev/shm where it can,
    so nothing appears in /scratch (its diff, its snapshot)."""
    import tempfile

    for base in ("/dev/shm", os.environ.get("TMPDIR") or tempfile.gettempdir()):
        try:
            return tempfile.mkdtemp(prefix="toolcage-ipython-", dir=base)
        except OSError:
            continue
    return tempfile.mkdtemp(prefix="toolcage-ipython-")


def main() -> int:
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ["IPYTHONDIR"] = ipython_dir = _ipython_dir()
    try:
        import IPython
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
    except Exception as exc:
        send({"t": "fatal", "missing": "IPython", "message": f"{type(exc).__name__}: {exc}"})
        return 3

    class Hook(DisplayHook):  # type: ignore[misc]
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: dict[str, Any], md_dict: Any = None) -> None:
            send({"t": "display", "data": _bundle(format_dict), "main": True})

        def finish_displayhook(self) -> None:
            pass

    class Pub(DisplayPublisher):  # type: ignore[misc]
        def publish(self, data: Any, metadata: Any = None, source: Any = None, **kw: Any) -> None:
            send({"t": "display", "data": _bundle(data), "main": False})

        def clear_output(self, wait: bool = False) -> None:
            send({"t": "clear"})

    class Shell(InteractiveShell):  # type: ignore[misc]
        displayhook_class = Hook
        display_pub_class = Pub

        def _showtraceback(self, etype: Any, evalue: Any, stb: Any) -> None:
            text = self.InteractiveTB.stb2text(stb) if isinstance(stb, list) else str(stb)
            send(
                {"t": "error", "name": getattr(etype, "__name__", str(etype)), "value": str(evalue), "traceback": text}
            )

    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.InteractiveShell.colors = "NoColor"
    cfg.InteractiveShell.xmode = "Context"
    shell = Shell.instance(config=cfg)
    import shutil

    shutil.rmtree(ipython_dir, ignore_errors=True)
    capture = _Capture()
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    send({"t": "ready", "python": sys.version.split()[0], "ipython": IPython.__version__, "pid": os.getpid()})
    while True:
        try:
            line = _IN.readline()
        except KeyboardInterrupt:  # an interrupt that came after its cell ended
            continue
        if not line:
            return 0
        try:
            req = json.loads(line)
            code = req["code"]
        except (ValueError, KeyError, TypeError):
            continue
        try:
            result = shell.run_cell(code, store_history=True)
            count = result.execution_count
        except KeyboardInterrupt:  # between the cell's end and here
            send({"t": "error", "name": "KeyboardInterrupt", "value": "", "traceback": "KeyboardInterrupt"})
            count = shell.execution_count - 1
        try:
            capture.drain()
        except KeyboardInterrupt:
            pass
        send({"t": "done", "execution_count": count})


if __name__ == "__main__":
    sys.exit(main())
