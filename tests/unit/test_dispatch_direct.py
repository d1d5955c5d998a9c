"""The worker's direct path (worker.dispatch.Dispatcher._direct) answers exactly as jsonrpcserver's whole pipeline
does: the same line, byte for byte, for every request it takes, and it takes only requests whose answer the
pipeline could give one way (a single request with an id, a method there is, params its check binds)."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolcage.worker import dispatch
from toolcage.worker.errors import ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog, Tool

_TMP = tempfile.mkdtemp(prefix="toolcage-direct-")
(Path(_TMP) / "a.txt").write_text("hello\n")


def _boom(settings: Any, params: Any) -> Any:
    raise ValueError("a handler's own bug, with a secret-looking message")


def _refuse(settings: Any, params: Any) -> Any:
    raise ToolError("refused", {"why": params})


def _echo(settings: Any, params: Any) -> Any:
    return {"params": params, "text": "é ☃ \u2028 \x00"}


def _dispatcher() -> dispatch.Dispatcher:
    catalog = Catalog({"list_files": "toolcage.worker.tools.files", "read_file": "toolcage.worker.tools.files"})
    for name, handler in (("echo", _echo), ("boom", _boom), ("refuse", _refuse)):
        catalog.add(Tool(name, name, None, handler))
    return dispatch.Dispatcher(Settings(None, _TMP, _TMP, "direct"), catalog)


D = _dispatcher()
_ERROR_ID = re.compile(r'"error_id": "[0-9a-f]{12}"')


def _both(line: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, bool]:
    """(the answer with the direct path, the answer through the whole pipeline, whether the direct path took it)."""
    took = D._direct(D.parse(line)) is not None
    direct = D.handle(line)
    with monkeypatch.context() as m:
        m.setattr(D, "_direct", lambda msg: None)
        usual = D.handle(line)
    return _ERROR_ID.sub('"error_id": "*"', direct), _ERROR_ID.sub('"error_id": "*"', usual), took


CASES: list[tuple[Any, bool]] = [
    ({"jsonrpc": "2.0", "method": "ping", "id": 1}, True),
    ({"jsonrpc": "2.0", "method": "ping", "id": "abc", "params": {}}, True),
    ({"jsonrpc": "2.0", "method": "ping", "id": None, "params": []}, True),  # id null: answered with id null
    ({"jsonrpc": "2.0", "method": "ping", "id": 1.5}, True),
    ({"jsonrpc": "2.0", "method": "ping", "id": 2, "params": {"x": 1}}, False),  # ping takes none: Invalid params
    ({"jsonrpc": "2.0", "method": "ping", "id": 2, "params": [1]}, False),
    ({"jsonrpc": "2.0", "method": "ping"}, False),  # a notification: no answer
    ({"jsonrpc": "2.0", "method": "nope", "id": 3}, False),  # Method not found, with the closest names
    ({"jsonrpc": "2.0", "method": "pnig", "id": 3}, False),
    ({"jsonrpc": "1.0", "method": "ping", "id": 4}, False),  # Invalid request
    ({"jsonrpc": "2.0", "method": "ping", "id": True}, False),
    ({"jsonrpc": "2.0", "method": "ping", "id": 5, "extra": 1}, False),
    ([{"jsonrpc": "2.0", "method": "ping", "id": 6}], False),  # a batch
    ({"jsonrpc": "2.0", "method": "list_files", "id": 7, "params": {"path": "."}}, True),
    ({"jsonrpc": "2.0", "method": "read_file", "id": 8, "params": {"path": "a.txt"}}, True),
    ({"jsonrpc": "2.0", "method": "read_file", "id": 9, "params": {"path": "../../etc/passwd"}}, True),
    ({"jsonrpc": "2.0", "method": "read_file", "id": 10, "params": {"nope": 1}}, True),  # the tool's own check
    ({"jsonrpc": "2.0", "method": "read_file", "id": 11, "params": ["a.txt"]}, False),  # positional: the pipeline
    ({"jsonrpc": "2.0", "method": "read_file", "id": 12}, True),
    (
        {
            "jsonrpc": "2.0",
            "method": "echo",
            "id": 13,
            "params": {"a": [1, {"b": None}], "_meta": {"progressToken": 1}},
        },
        True,
    ),
    ({"jsonrpc": "2.0", "method": "boom", "id": 14, "params": {}}, True),  # an error id only, never the message
    ({"jsonrpc": "2.0", "method": "refuse", "id": 15, "params": {"q": "r"}}, True),
    ({"jsonrpc": "2.0", "method": "sandbox.configure", "id": 16, "params": [1]}, False),
]


@pytest.mark.parametrize(("request_", "direct"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_the_direct_path_answers_as_the_pipeline(request_: Any, direct: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    with_direct, usual, took = _both(json.dumps(request_).encode(), monkeypatch)
    assert with_direct == usual
    assert took is direct
    if "boom" in json.dumps(request_):
        assert "secret-looking" not in with_direct and '"error_id"' in with_direct


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
REQUESTS = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "2.0", "1.0"]),
        "method": st.sampled_from(["ping", "list_files", "read_file", "echo", "refuse", "boom", "nope", ""]),
    },
    optional={
        "id": st.none() | st.integers() | st.text(max_size=5) | st.booleans() | st.floats(allow_nan=False),
        "params": JSONISH,
        "extra": st.integers(),
    },
)


@settings(max_examples=300, deadline=None)
@given(REQUESTS)
def test_any_request_gets_the_same_answer_either_way(request_: dict[str, Any]) -> None:
    line = json.dumps(request_).encode()
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_direct, usual, _ = _both(line, monkeypatch)
    assert with_direct == usual
