"""The library logs through the standard logger ``toolcage`` and is silent by default; the CLI prints
warnings in the documented ``toolcage: warning: …`` form."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
import structlog
from click.testing import CliRunner

from toolcage import logs
from toolcage.cli.main import cli

EVIL = "\x1b[2K\rFAKE ok"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter (nothing of this process's logging or structlog set up), which must
    succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(autouse=True)
def _unconfigured() -> Iterator[None]:
    """Each test starts as an application that has configured no structlog (the CLI tests configure it)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_a_library_run_writes_nothing_to_stderr() -> None:
    """A run with default settings (here --sandbox none, which warns) and a warning such as gc.removed
    print nothing on the application's stderr or stdout beyond what it printed itself."""
    code = (
        "from toolcage import Sandbox, logs\n"
        "with Sandbox(sandbox='none', audit=False) as sb:\n"
        "    assert sb.call('run_shell', {'command': 'echo out; echo err >&2'}).ok\n"
        "logs.get_logger(run_id='r1').warning('gc.removed', kind='container', name='n')\n"
        "logs.get_logger().error('audit.write_failed', path='/x')\n"
        "print('done')\n"
    )
    out = _python(code)
    assert (out.stdout, out.stderr) == ("done\n", "")


def test_the_application_configures_what_it_sees(caplog: pytest.LogCaptureFixture) -> None:
    """Records go to logging.getLogger('toolcage') at their level, the message one escaped line, the fields
    on ``record.toolcage``; below the level the application set, nothing is built."""
    caplog.set_level(logging.WARNING, logger="toolcage")
    log = logs.get_logger(run_id="r1")
    log.info("run.started", image="i")  # filtered out
    log.warning("run.kept", container="toolcage-x", note=EVIL)
    [rec] = caplog.records
    assert rec.name == "toolcage" and rec.levelno == logging.WARNING
    assert rec.getMessage() == 'run.kept run_id=r1 container=toolcage-x note="\\u001b[2K\\rFAKE ok"'
    assert rec.toolcage == {"run_id": "r1", "container": "toolcage-x", "note": EVIL}  # type: ignore[attr-defined]


def test_cli_warnings_have_the_documented_form() -> None:
    """The CLI prints a library warning as one `toolcage: warning: event key=value` line on stderr."""
    out = CliRunner().invoke(cli, ["run", "ping", "--sandbox", "none"])
    assert out.exit_code == 0, out.output
    lines = [x for x in out.stderr.splitlines() if "sandbox.not_isolated" in x]
    assert len(lines) == 1 and lines[0].startswith("toolcage: warning: sandbox.not_isolated run_id=")
    assert "NOTHING IS ISOLATED" in lines[0]


def test_cli_configures_logging_for_every_command() -> None:
    """A command without -v still shows warnings in the documented form (gc's, ps's, ...): the group configures
    logging, each command's -v only raises the level."""
    out = CliRunner().invoke(cli, ["policy", "test", "default", "https://example.com/"])
    assert out.exit_code == 1, out.output  # denied: network.mode none
    assert structlog.is_configured()
    renderer = logs._CliRenderer()
    assert renderer(None, "warning", {"event": "gc.removed", "name": EVIL, "level": "warning"}) == (
        'toolcage: warning: gc.removed name="\\u001b[2K\\rFAKE ok"'
    )
    assert renderer(None, "error", {"event": "audit.write_failed", "path": "/x"}) == (
        "toolcage: error: audit.write_failed path=/x"
    )


def test_structlog_loads_with_the_first_record_wanted() -> None:
    """Importing toolcage and logging below every level loads neither structlog nor the asyncio it imports
    (about 45 ms of every `toolcage run`, which logs nothing at its default level); the first record that
    goes somewhere loads it and reaches the application's handler."""
    code = (
        "import logging, sys\n"
        "from toolcage import logs\n"
        "import toolcage.sandbox, toolcage.rpc.session\n"
        "log = logs.get_logger(run_id='r1').bind(name='n')\n"
        "log.info('run.started'); log.debug('worker.stderr', line='x')\n"
        "print(sorted(m for m in ('structlog', 'asyncio') if m in sys.modules))\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "log.info('run.kept', container='c')\n"
        "print('structlog' in sys.modules)\n"
    )
    out = _python(code)
    assert out.stdout.splitlines() == ["[]", "INFO run.kept run_id=r1 name=n container=c", "True"]


def test_the_commands_warning_is_printed_when_structlog_loads_after_configure() -> None:
    """The command line configures logging before structlog is loaded; its first warning loads it, in the
    documented form, on stderr, and stdout stays the command's result."""
    code = (
        "import sys\n"
        "from toolcage.cli.main import main\n"
        "sys.argv = ['toolcage', 'run', 'ping', '--sandbox', 'none']\n"
        "main()\n"
    )
    out = _python(code)
    assert json.loads(out.stdout)["status"] == "ok"
    [line] = [x for x in out.stderr.splitlines() if "sandbox.not_isolated" in x]
    assert line.startswith("toolcage: warning: sandbox.not_isolated run_id=")


def test_a_record_while_another_thread_imports_structlog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first wanted record may load structlog on one thread while another thread logs: a module still
    being imported (no is_configured yet) is taken as not configured, never an AttributeError (seen when the
    watchdog's warning and the start's info line met)."""
    import copy
    import pickle
    import types

    monkeypatch.setitem(sys.modules, "structlog", types.ModuleType("structlog"))  # half made: nothing in it yet
    log = logs.get_logger(run_id="r1")
    assert log.info("run.started") is None  # below the standard logger's level: nothing built
    assert copy.copy(log)._context == {"run_id": "r1"}
    assert pickle.loads(pickle.dumps(log))._context == {"run_id": "r1"}
