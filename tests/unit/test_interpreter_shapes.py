"""toolcage.interpreter against E2B's documented result shape, and execution() on code_run's answers.

The table below is written from E2B's public documentation of its code interpreter SDK, not from its code:
- https://e2b.dev/docs/sdk-reference/code-interpreter-js-sdk/v1.5.1/messaging (Execution: results, logs,
  error, executionCount, the text accessor; ExecutionError: name, value, traceback; Result's formats)
- https://e2b.dev/docs/code-interpreting/streaming and the Python SDK's README
  (https://pypi.org/project/e2b-code-interpreter/): ``run_code``, ``execution.text``, ``logs.stdout`` as a
  list of chunks (``"".join(execution.logs.stdout)``), ``on_stdout``/``on_stderr``/``on_result``/``on_error``
- E2B's release note for code-interpreter-python 2.11.7 (png, jpeg and pdf are base64 text; logs hold raw
  chunks with their newlines)
- the contexts' reference (createCodeContext -> Context: id, language, cwd)
Python's names are snake_case (``execution_count``, ``is_main_result``), as the Python SDK spells them.

E2B fields toolcage does not offer, on purpose: ``Result.chart`` (E2B's chart extraction from matplotlib
figures; toolcage returns the figure as a PNG) and ``Result.data`` (a catch-all of the raw bundle: toolcage
keeps only MIME types from a fixed list, see ``mime_bundle()``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from toolcage import interpreter
from toolcage.interpreter import CodeContext, Execution, ExecutionError, Logs, Result, execution

# (class, field, the type E2B documents, as the Python annotation toolcage must carry)
E2B_SHAPE: list[tuple[type, str, Any]] = [
    (Execution, "results", list[Result]),
    (Execution, "logs", Logs),
    (Execution, "error", ExecutionError | None),
    (Execution, "execution_count", int | None),
    (Result, "text", str | None),
    (Result, "html", str | None),
    (Result, "markdown", str | None),
    (Result, "svg", str | None),
    (Result, "png", str | None),  # base64
    (Result, "jpeg", str | None),  # base64
    (Result, "pdf", str | None),  # base64
    (Result, "latex", str | None),
    (Result, "json", dict[str, Any] | list[Any] | None),
    (Result, "javascript", str | None),
    (Result, "is_main_result", bool),
    (Result, "extra", dict[str, Any]),
    (Logs, "stdout", list[str]),
    (Logs, "stderr", list[str]),
    (ExecutionError, "name", str),
    (ExecutionError, "value", str),
    (ExecutionError, "traceback", str),
    (CodeContext, "id", str),
    (CodeContext, "language", str),
    (CodeContext, "cwd", str | None),
]
# E2B's methods and accessors, by name: Execution.text (the main result's text), Execution.to_json,
# Result.formats() (the formats it has, text aside)
E2B_MEMBERS: list[tuple[type, str]] = [(Execution, "text"), (Execution, "to_json"), (Result, "formats")]
# the MIME types of a Jupyter bundle and E2B's attribute for each
E2B_MIMES = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


@pytest.mark.parametrize(("cls", "name", "annotation"), E2B_SHAPE, ids=[f"{c.__name__}.{n}" for c, n, _ in E2B_SHAPE])
def test_field_is_e2b_shaped(cls: type, name: str, annotation: Any) -> None:
    hints = typing.get_type_hints(cls, vars(interpreter))
    assert name in {f.name for f in dataclasses.fields(cls)}, f"{cls.__name__} has no field {name}"
    assert hints[name] == annotation, (cls.__name__, name, hints[name])


@pytest.mark.parametrize(("cls", "name"), E2B_MEMBERS, ids=[f"{c.__name__}.{n}" for c, n in E2B_MEMBERS])
def test_member_is_there(cls: type, name: str) -> None:
    assert hasattr(cls, name)


def test_every_e2b_field_is_pinned() -> None:
    """The table names every E2B field of the five classes toolcage has (a field renamed fails here)."""
    pinned = {(c, n) for c, n, _ in E2B_SHAPE}
    toolcage_only = {"context", "status", "timed_out", "truncated", "dropped", "restarted"}  # Execution's own
    for cls in (Execution, Result, Logs, ExecutionError, CodeContext):
        for f in dataclasses.fields(cls):
            assert (cls, f.name) in pinned or (cls is Execution and f.name in toolcage_only), (cls, f.name)


def test_mime_types_map_to_e2b_attributes() -> None:
    assert interpreter.FORMATS == E2B_MIMES


def test_defaults_are_empty() -> None:
    ex = Execution()
    assert (ex.results, ex.logs, ex.error, ex.execution_count, ex.text) == ([], Logs([], []), None, None, None)
    assert Result().formats() == [] and str(Result()) == ""


def test_execution_text_and_formats() -> None:
    ex = execution(
        {
            "results": [
                {"data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}, "is_main_result": False},
                {"data": {"text/plain": "42", "text/html": "<b>42</b>"}, "is_main_result": True},
            ],
            "execution_count": 3,
        }
    )
    assert ex.text == "42" and ex.execution_count == 3
    assert ex.results[0].formats() == ["png"] and ex.results[1].formats() == ["html"]
    assert ex.results[1].mime_bundle() == {"text/plain": "42", "text/html": "<b>42</b>"}
    assert '"execution_count": 3' in ex.to_json()


def test_unknown_mime_types_and_wrong_types_are_left_out() -> None:
    ex = execution(
        {
            "results": [
                {
                    "data": {
                        "text/plain": "x",
                        "application/vnd.evil+json": {"a": 1},
                        "text/html": 5,  # not a str
                        "image/png": ["not", "a", "str"],
                        "application/json": "a str is not JSON's dict or list",
                    },
                    "is_main_result": "yes",  # truthy, not True: execution() takes bool()
                },
                "not a dict",
                {"is_main_result": True},  # no data: an empty Result
            ]
        }
    )
    assert len(ex.results) == 2
    r = ex.results[0]
    assert r.mime_bundle() == {"text/plain": "x"} and r.is_main_result is True
    assert ex.results[1] == Result(is_main_result=True)


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None, True]}, [1, "two", {"three": 3}], {}, []])
def test_json_dicts_and_lists_come_through(value: Any) -> None:
    r = execution({"results": [{"data": {"application/json": value}}]}).results[0]
    assert r.json == value and r.formats() == ["json"]


@pytest.mark.parametrize("value", ["text", 3, 2.5, True, None])
def test_json_scalars_are_left_out(value: Any) -> None:
    assert execution({"results": [{"data": {"application/json": value}}]}).results[0].json is None


def test_status_fields() -> None:
    ex = execution(
        {
            "context": "ctx-2",
            "status": "interrupted",
            "timed_out": True,
            "truncated": 1,
            "dropped": {"results": 3, "mime_types": "2"},
            "restarted": True,
            "error": {"name": "KeyboardInterrupt", "value": "", "traceback": "Traceback ..."},
            "logs": {"stdout": ["a\n", "b"], "stderr": None},
        }
    )
    assert (ex.context, ex.status, ex.timed_out, ex.truncated, ex.restarted) == (
        "ctx-2",
        "interrupted",
        True,
        True,
        True,
    )
    assert ex.dropped == {"results": 3, "mime_types": 2}
    assert ex.error == ExecutionError("KeyboardInterrupt", "", "Traceback ...")
    assert ex.logs == Logs(stdout=["a\n", "b"], stderr=[])
    assert "".join(ex.logs.stdout) == "a\nb"  # E2B's way to rebuild the output


def test_a_minimal_answer() -> None:
    ex = execution({})
    assert (ex.context, ex.status, ex.timed_out, ex.truncated, ex.dropped, ex.restarted, ex.error) == (
        "default",
        "ok",
        False,
        False,
        {},
        False,
        None,
    )


def test_an_error_missing_parts_is_still_an_error() -> None:
    ex = execution({"status": "error", "error": {"name": "ValueError"}})
    assert ex.error == ExecutionError("ValueError", "", "")
    assert execution({"error": "not a dict"}).error is None
