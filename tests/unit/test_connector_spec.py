"""``@tool`` functions become tools: name, description, strict params and their schema, read off the function."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from annotated_types import Ge

from toolcage.sdk import Context, tool
from toolcage.worker.connectors.spec import SpecError, spec_of
from toolcage.worker.errors import BadParams


@tool
def list_issues(ctx: Context, repo: str, state: Literal["open", "closed"] = "open", limit: int = 20) -> dict:
    """List the issues of a repository.

    Args:
        repo: owner/name
        limit: at most this many
    """
    return {}


@tool(name="tags.list", description="Tags, named otherwise")
def tags(repo: str, labels: list[str] | None = None, depth: Annotated[int, Ge(1)] = 1) -> dict:
    """Not this text."""
    return {}


def test_name_description_and_schema_come_from_the_function() -> None:
    """The function's name, its docstring before Args:, and each argument's line from Args: describe the tool."""
    spec = spec_of(list_issues)
    info = spec.describe("github")
    assert (spec.name, spec.wants_context) == ("list_issues", True)
    assert info["description"] == "List the issues of a repository."
    props = info["params_schema"]["properties"]
    assert set(props) == {"repo", "state", "limit"} and info["params_schema"]["required"] == ["repo"]
    assert props["repo"]["description"] == "owner/name" and props["limit"]["description"] == "at most this many"
    assert props["state"]["enum"] == ["open", "closed"] and info["params_schema"]["additionalProperties"] is False
    assert (info["source"], info["module"]) == ("connector", "github")


def test_decorator_arguments_and_no_context() -> None:
    """@tool(name=, description=) win over the function's; a handler may take no Context."""
    spec = spec_of(tags)
    assert (spec.name, spec.description, spec.wants_context) == ("tags.list", "Tags, named otherwise", False)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "repo"),
        ({"repo": 3}, "repo"),
        ({"repo": "a/b", "limit": "20"}, "limit"),
        ({"repo": "a/b", "limit": True}, "limit"),
        ({"repo": "a/b", "state": "all"}, "state"),
        ({"repo": "a/b", "extra": 1}, "extra"),
    ],
)
def test_params_are_checked_strictly(raw: dict, field: str) -> None:
    """Wrong types, missing and unknown fields are -32602 with the field named, as for built-in tools."""
    with pytest.raises(BadParams) as exc:
        spec_of(list_issues).validate(raw)
    assert exc.value.code == -32602 and any(e["field"] == field for e in exc.value.data)


def test_valid_params_become_keyword_arguments() -> None:
    """Defaults are filled in; lists and constrained ints pass when they fit."""
    assert spec_of(list_issues).validate({"repo": "a/b"}) == {"repo": "a/b", "state": "open", "limit": 20}
    assert spec_of(tags).validate({"repo": "r", "labels": ["x"], "depth": 2}) == {
        "repo": "r",
        "labels": ["x"],
        "depth": 2,
    }
    with pytest.raises(BadParams):
        spec_of(tags).validate({"repo": "r", "depth": 0})


def _undocumented(ctx: Context, x: int) -> None:
    pass


def _unhinted(ctx: Context, x) -> None:  # type: ignore[no-untyped-def]
    """Doc."""


def _star(ctx: Context, *xs: int) -> None:
    """Doc."""


def _mutable(ctx: Context, xs: list[int] = [1]) -> None:  # noqa: B006
    """Doc."""


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (_undocumented, "docstring"),
        (_unhinted, "type hint"),
        (_star, r"\*args"),
        (_mutable, "mutable default"),
    ],
)
def test_functions_that_cannot_be_tools_say_why(fn, words: str) -> None:  # type: ignore[no-untyped-def]
    """A tool without a docstring, a hint, with *args or a mutable default is refused with the reason."""
    with pytest.raises(SpecError, match=words):
        spec_of(tool(fn))
