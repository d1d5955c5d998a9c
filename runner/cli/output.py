"""How the CLI talks, in one place: results on stdout, diagnostics on stderr, every error translated once.

The convention (README, "The CLI"):
- stdout carries the command's result and nothing else: text for people by default, one JSON
  document with ``--json`` (``run``, ``policy test`` and ``image build`` always print JSON;
  ``serve``'s stdout is the JSON-RPC stream).
- stderr carries diagnostics for people, plain text, one line each, prefixed ``toolcage:``
  (``toolcage: warning:`` for warnings), escaped with ``textsafe.escape``: a message may quote
  text a sandbox chose.
- An error is always such a stderr line; in JSON mode stdout also gets
  ``{"status", "error": {"reason", "message", ...}}`` so a program reading stdout gets a document.
- Exit codes come from the error classes (``ToolcageError.exit_code``, policy errors included;
  click's ``exit_code``): 0 ok, 1 tool error or finding, 2 usage or policy error, 3 sandbox failure.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from toolcage.errors import ToolcageError
from toolcage.textsafe import dumps, escape

# commands whose stdout is always JSON, by their path below the program name
JSON_COMMANDS = frozenset({"run", "policy test", "image build"})


class _State:
    json: bool | None = None  # set by a command once its options are parsed


def use_json(flag: bool | None) -> None:
    """A command declares its mode; errors raised after this follow it."""
    _State.json = flag


def emit(obj: Any) -> None:
    """The result, as JSON, on stdout."""
    sys.stdout.write(dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def say(message: object) -> None:
    """One line for people on stderr, escaped."""
    click.echo(f"toolcage: {escape(message)}", err=True)


def warn(message: object) -> None:
    click.echo(f"toolcage: warning: {escape(message)}", err=True)


def _stream_text(text: str) -> str:
    """A sandbox's output for a terminal: its line breaks and tabs kept, every other control character
    (escape sequences, a carriage return that would overwrite a line, bidi marks) shown escaped."""
    return "".join(part if part in ("\n", "\t") else escape(part) for part in _BREAKS.split(text))


_BREAKS = re.compile(r"([\n\t])")


class CallOutput:
    """What a call streams while it runs (the worker's progress notifications, MCP's shape): shown on
    stderr as it comes when asked (``show``: stderr is a terminal, or ``--stream``), never on stdout;
    and, for a tool whose progress is its output (``is_output``: run_python, run_shell, run_node,
    exec), kept, so that an interrupted run still says what its call printed, as a timeout does.
    It is an ``on_progress`` callback: it runs on the session's reader thread."""

    def __init__(self, *, show: bool, is_output: bool, keep: int) -> None:
        self.show = show
        self.is_output = is_output
        # kept here, not by trusting the worker's coalescing: the channel lets a request 20,000 progress
        # notifications of up to a line's length each, so the runner bounds what it holds itself
        self._keep = keep  # characters kept at most (the CLI: stdout's and stderr's output caps)
        self._parts: list[str] = []
        self._kept = 0
        self.truncated = False  # more came than was kept
        self._line_open = False  # the last output shown did not end its line

    @property
    def wanted(self) -> bool:
        """Whether the call should ask for progress at all."""
        return self.show or self.is_output

    @property
    def text(self) -> str:
        """The output streamed so far (stdout and stderr as they came), its first ``keep`` characters."""
        return "".join(self._parts)

    def kept(self) -> dict[str, Any]:
        """What the call printed so far, as an interrupted run's result and an error carry it: ``output`` (and
        ``output_truncated: true`` when more came), for a tool whose progress is its output; else nothing."""
        if not self.is_output:
            return {}
        return {"output": self.text, **({"output_truncated": True} if self.truncated else {})}

    def __call__(self, params: dict[str, Any]) -> None:
        message = params.get("message")
        if not isinstance(message, str) or not message:
            return
        if self.is_output:
            room = self._keep - self._kept
            if len(message) > room:
                self.truncated = True
            if room > 0:
                self._parts.append(message[:room])
                self._kept += min(len(message), room)
            if self.show:
                sys.stderr.write(_stream_text(message))
                sys.stderr.flush()
                self._line_open = not message.endswith("\n")
        elif self.show:  # a connector's report (ctx.progress): one line of its own
            total = params.get("total")
            done = f"{params.get('progress')}/{total}" if total is not None else f"{params.get('progress')}"
            say(f"progress {done}: {message}")

    def end(self) -> None:
        """After the call: the next stderr line starts a line of its own."""
        if self._line_open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._line_open = False


def error_payload(exc: BaseException) -> tuple[dict[str, Any], int]:
    """The JSON error object and exit code for any error the CLI can meet."""
    if isinstance(exc, ToolcageError):
        return exc.to_dict(), exc.exit_code
    if isinstance(exc, click.ClickException):
        return {"status": "error", "reason": "usage", "message": exc.format_message()}, exc.exit_code
    if isinstance(exc, click.Abort | KeyboardInterrupt):
        return {"status": "error", "reason": "interrupted", "message": "interrupted"}, 130
    raise TypeError(f"not a CLI error: {type(exc).__name__}")


def _command_path(ctx: click.Context | None) -> str:
    return " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""


def _json_mode(exc: BaseException, argv: list[str]) -> bool:
    if _State.json is not None:
        return _State.json
    # the command never ran (click rejected its arguments): decide from what was asked for
    ctx = getattr(exc, "ctx", None)
    return _command_path(ctx) in JSON_COMMANDS or "--json" in argv


def report(exc: BaseException, argv: list[str]) -> int:
    """Print ``exc`` by the convention; return the exit code."""
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.exceptions.NoArgsIsHelpError) and ctx is not None:
        click.echo(ctx.get_help(), err=True)  # `toolcage` (or a group) alone: its help, our own text, as click does
        return exc.exit_code
    payload, code = error_payload(exc)
    if _json_mode(exc, argv):
        emit({"status": payload["status"], "error": payload})
    if isinstance(exc, click.UsageError) and ctx is not None:
        # one line, as every error: where to look next on the same line, not a second one
        message = payload["message"].rstrip()
        stop = "" if message.endswith((".", "?", "!", ".)", "?)")) else "."
        say(f"{message}{stop} Try '{ctx.command_path} --help'.")
    else:
        say(payload["message"])
    return code


class ToolcageGroup(click.Group):
    """The top-level group: runs a command and translates whatever it raised, once. Commands
    named in ``lazy_commands`` (name -> module) come from their module's ``register(group)``,
    called the first time one of them is needed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self.lazy_commands.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            import importlib

            importlib.import_module(module).register(self)
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        extra.pop("standalone_mode", None)
        _State.json = None
        try:
            rv = super().main(args, prog_name, standalone_mode=False, **extra)
        except (ToolcageError, click.ClickException, click.Abort) as exc:
            sys.exit(report(exc, argv))
        sys.exit(rv if isinstance(rv, int) else 0)


__all__ = ["JSON_COMMANDS", "CallOutput", "ToolcageGroup", "emit", "error_payload", "report", "say", "use_json", "warn"]
