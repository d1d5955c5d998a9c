"""``--sandbox none``: the same worker as a local subprocess, for development only. Nothing is isolated:
no container, no read-only workspace, no network block; every start says so."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, ClassVar

from toolcage import logs
from toolcage.backends.base import BackendOptions, ExitStatus
from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import RunSpec
from toolcage.policies import Policy, contract
from toolcage.rpc.transport import StreamParser, Transport, write_until

NONE_WARNING = (
    "--sandbox none: the tool runs as a plain process on this host with your privileges. "
    "NOTHING IS ISOLATED (no container, no read-only workspace, no network block). Development only."
)
# how --sandbox none starts the worker (tests swap in misbehaving workers)
LOCAL_WORKER_ARGV = [sys.executable, "-m", "toolcage.worker"]


class ProcessBackend:
    """The same worker as a local subprocess (``--sandbox none``): development only, nothing isolated."""

    strength: ClassVar[int] = 0
    in_container: ClassVar[bool] = False
    auto: ClassVar[bool] = False  # never picked by auto
    how_to_use: ClassVar[str] = "use --sandbox none (nothing isolated: development only)"
    sandbox_user = False
    container_id: str | None = None

    def __init__(self, policy: Policy, options: BackendOptions) -> None:
        self.policy, self.workspace, self.ca_pem = policy, options.workspace, options.ca_pem
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmpdirs: list[str] = []

    @classmethod
    def unavailable(cls, engine: EngineAPI | None) -> str | None:
        return None

    def image_id(self) -> str | None:
        return None

    def complete(self, run: RunSpec) -> RunSpec:
        return run  # no container: nothing to decide

    def start(self, run: RunSpec, parser: StreamParser) -> Transport:
        logs.get_logger(run_id=run.run_id).warning("sandbox.not_isolated", note=NONE_WARNING)
        scratch = tempfile.mkdtemp(prefix=f"toolcage-{run.run_id}-scratch-")
        self._tmpdirs.append(scratch)
        workspace = self.workspace or ""  # "": no workspace (the worker says so instead of listing nothing)
        copy = {}
        if run.workspace_copy:  # a directory of its own, filled over the protocol (no size cap here)
            workspace = tempfile.mkdtemp(prefix=f"toolcage-{run.run_id}-workspace-")
            self._tmpdirs.append(workspace)
            copy = {contract.ENV_WORKSPACE_COPY: "1"}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            contract.ENV_POLICY: self.policy.canonical_json(),
            contract.ENV_RUN_ID: run.run_id,
            contract.ENV_DEADLINE: f"{run.deadline:.3f}",
            contract.ENV_WORKSPACE: workspace,
            contract.ENV_SCRATCH: scratch,
            contract.ENV_WATCH_RUNNER: "1",
            **copy,
            **({contract.ENV_CA_PEM: self.ca_pem} if self.ca_pem else {}),
        }
        transport = ProcessTransport(list(LOCAL_WORKER_ARGV), env, scratch, parser)
        self.proc = transport.proc
        transport.start()
        return transport

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)  # its own session: the children go too

    def exit_status(self, timeout: float) -> ExitStatus:
        if self.proc is None:
            return ExitStatus(None)
        try:
            return ExitStatus(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return ExitStatus(None)

    def remove(self, keep: bool) -> None:
        try:
            if self.proc is not None and self.exit_status(2).exit_code is None:
                self.kill()
                self.proc.wait(timeout=5)
        finally:
            for d in self._tmpdirs:
                shutil.rmtree(d, ignore_errors=True)


class ProcessTransport:
    """A local worker subprocess (``--sandbox none``): same protocol, no isolation."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, parser: StreamParser) -> None:
        self.parser = parser
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, parser.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, parser.stderr, False), daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, sink: Any, is_stdout: bool) -> None:
        fd = stream.fileno()
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                sink(chunk)
        finally:
            if is_stdout:
                self.parser.eof()

    def send(self, data: bytes, until: float | None = None) -> None:
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        with self._lock:
            os.set_blocking(fd, False)  # only this method writes the pipe, always through _write_until
            write_until(fd, data, until, lambda v: os.write(fd, v))

    def close_stdin(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.close_stdin()
        for t in self._threads:
            t.join(timeout=2)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


__all__ = ["LOCAL_WORKER_ARGV", "NONE_WARNING", "ProcessBackend", "ProcessTransport"]
