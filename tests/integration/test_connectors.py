"""Connectors end to end: sources listed and called, author mistakes refused at start, secrets added by the worker.

Most cases run in a container; the SafeFetch ones use ``--sandbox none`` against loopback
servers (the container cases with a real upstream are in test_connector_example.py).
"""

from __future__ import annotations

import http.server
import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox, UsageError

GOOD = '''
from toolcage.sdk import Context, tool

@tool
def add(ctx: Context, a: int, b: int = 1) -> dict:
    """Add two numbers."""
    print("noise on stdout")
    ctx.log.info("adding", a=a)
    ctx.progress(1, 2, "half")
    return {"sum": a + b, "scratch": str(ctx.scratch)}

@tool
def not_json(ctx: Context) -> dict:
    """Returns a set."""
    return {"s": {1, 2}}

@tool
def big(ctx: Context, n: int) -> str:
    """Returns n bytes."""
    return "x" * n

@tool
def fetch(ctx: Context, url: str, auth: str | None = None) -> dict:
    """Fetch a URL."""
    r = ctx.fetch(url, auth=auth)
    return {"status": r.status, "body": r.text, "url": r.url}
'''


# a module that, while it is imported, finds the loading child's socket and asks for a fetch
IMPORT_TIME_FETCH = """
import os, socket
for fd in sorted(map(int, os.listdir("/proc/self/fd"))):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.family == socket.AF_UNIX:
        s.sendall(b'{"op": "fetch", "url": "https://api.example.test/", "method": "GET", "headers": {}}\\n')
        raise RuntimeError(s.recv(4096).decode())
raise RuntimeError("no socket found")
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write(tmp_path / "conn" / "good.py", GOOD)


def test_connectors_are_listed_and_called(engine: Any, no_leaks: None, good: Path, tmp_path: Path) -> None:
    """tools.list shows a folder's and a package's tools with schemas; calls validate, answer and contain mistakes."""
    write(tmp_path / "pkg" / "mypkg" / "__init__.py", "from .inner import shout\n")
    write(
        tmp_path / "pkg" / "mypkg" / "inner.py",
        '''
        from toolcage.sdk import tool

        @tool
        def shout(text: str) -> str:
            """Upper-case a text."""
            return text.upper()
        ''',
    )
    with Sandbox(tools=[good.parent, tmp_path / "pkg" / "mypkg"]) as sb:
        listing = {t["name"]: t for t in sb.call("tools.list").result}
        assert {"add", "not_json", "big", "fetch", "shout", "run_python"} <= set(listing)
        assert listing["add"]["params_schema"]["required"] == ["a"] and listing["add"]["source"] == "connector"
        ok = sb.call("add", {"a": 2})
        assert ok.status == "ok" and ok.result == {"sum": 3, "scratch": "/scratch"}
        assert sb.call("shout", {"text": "hi"}).result == "HI"
        bad = sb.call("add", {"a": "2"})
        assert bad.error["code"] == -32602 and bad.error["data"][0]["field"] == "a"
        nj = sb.call("not_json")
        assert nj.error["code"] == -32001 and "not JSON" in nj.error["message"]
        assert sb.call("ping").result == "pong"


def test_result_over_the_cap_is_output_capped(engine: Any, no_leaks: None, good: Path, tmp_path: Path) -> None:
    """A result larger than limits.output_cap is refused with status output_capped, not sent."""
    pol = write(tmp_path / "p.yaml", "name: small\nlimits: {output_cap: 4k}\n")
    with Sandbox(pol, tools=[good]) as sb:
        assert sb.call("big", {"n": 100}).ok
        r = sb.call("big", {"n": 10_000})
        assert r.status == "output_capped" and r.error["code"] == -32023


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"a.py": GOOD.replace("def add", "def run_python").replace("Add two", "Shadow")}, "is a built-in tool"),
        ({"a.py": GOOD, "b.py": GOOD}, "tool name clash: add"),
        ({"a.py": "import not_a_module_anywhere\n"}, "ModuleNotFoundError"),
        ({"a.py": "def broken(:\n"}, "SyntaxError"),
        ({"a.py": "from toolcage.sdk import tool\n@tool\ndef f(x: int): pass\n"}, "needs a docstring"),
        ({"a.py": IMPORT_TIME_FETCH}, "may not fetch or read secrets while they load"),
    ],
)
def test_author_mistakes_are_usage_errors_before_any_call(
    engine: Any, no_leaks: None, tmp_path: Path, files: dict[str, str], words: str
) -> None:
    """A clash with a built-in or between connectors, a module that does not import, a tool without a docstring:
    UsageError at start, naming the problem, and the sandbox is gone."""
    for name, text in files.items():
        write(tmp_path / "c" / name, text)
    with pytest.raises(UsageError, match=words):
        Sandbox(tools=[tmp_path / "c"]).start()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append({"port": str(self.server.server_address[1]), "path": self.path, **self.headers})
        if self.path == "/away":
            other = self.server.other_port  # type: ignore[attr-defined]
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other}/landed")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps(dict(self.headers)).encode()  # echoes every header back, the secret too
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[int, int]]:
    a = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    b = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    a.other_port = b.server_address[1]  # type: ignore[attr-defined]
    for s in (a, b):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield a.server_address[1], b.server_address[1]
    for s in (a, b):
        s.shutdown()
        s.server_close()


TOKEN = "tcsecret_5f0c3d1e9b7a4c2d"


def test_secret_header_is_added_by_the_worker_only_for_its_origin(
    servers: tuple[int, int], good: Path, tmp_path: Path
) -> None:
    """--sandbox none, loopback: the bound origin gets the header, another port does not (directly or by
    redirect), and what comes back to the handler and the caller has the value redacted."""
    bound, other = servers
    pol = write(
        tmp_path / "p.yaml",
        f"""
        name: loop
        network:
          mode: proxy
          allow: [{{host: 127.0.0.1, schemes: [http], ports: [{bound}, {other}]}}]
          allow_private_cidrs: [127.0.0.0/8]
        secrets:
          TOK: {{send_to: {{host: 127.0.0.1, scheme: http, port: {bound}, header: X-Api-Key, format: "{{value}}"}}}}
        """,
    )
    _Recorder.seen.clear()
    with Sandbox(pol, sandbox="none", tools=[good], secrets={"TOK": TOKEN}, audit=tmp_path / "a.jsonl") as sb:
        echoed = sb.call("fetch", {"url": f"http://127.0.0.1:{bound}/echo", "auth": "TOK"})
        elsewhere = sb.call("fetch", {"url": f"http://127.0.0.1:{other}/echo", "auth": "TOK"})
        redirected = sb.call("fetch", {"url": f"http://127.0.0.1:{bound}/away", "auth": "TOK"})
        plain = sb.call("fetch", {"url": f"http://127.0.0.1:{bound}/echo"})
    assert echoed.ok and json.loads(echoed.result["body"])["X-Api-Key"] == "[secret TOK]"
    assert elsewhere.error["code"] == -32010 and elsewhere.error["data"]["reason"] == "secret_not_bound"
    assert redirected.ok and redirected.result["url"].endswith("/landed")
    assert plain.ok and "X-Api-Key" not in json.loads(plain.result["body"])
    keyed = [(s["port"], s["path"]) for s in _Recorder.seen if s.get("X-Api-Key") == TOKEN]
    assert keyed == [(str(bound), "/echo"), (str(bound), "/away")]  # never the other port, never after the redirect
    everything = json.dumps([echoed.to_dict(), elsewhere.to_dict(), redirected.to_dict(), plain.to_dict()])
    audit = (tmp_path / "a.jsonl").read_text()
    assert TOKEN not in everything and TOKEN not in audit
    calls = [json.loads(line) for line in audit.splitlines() if '"run.call"' in line]
    sent = [c.get("secrets_sent") for c in calls]
    assert sent[0] == [{"secret": "TOK", "origin": f"http://127.0.0.1:{bound}", "method": "GET"}]
    assert sent[1] == [] and sent[3] == []
