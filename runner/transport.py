"""Byte streams to and from a worker, treated as hostile: bounded lines, bounded memory.

Two transports share one parser: the container's attach socket (Docker multiplexes
stdout and stderr into 8-byte-header frames) and a local subprocess's pipes
(``--sandbox none``). A reader thread turns stdout into JSON messages on a queue and
keeps only the tail of stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import subprocess
import threading
from collections import deque
from typing import Any

STDERR_TAIL_BYTES = 64 * 1024
EOF_MARK = object()


class Broken:
    """Queued when the stream can no longer be trusted (garbage, oversized line)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class StreamParser:
    """Splits worker stdout into JSON messages (queued) and keeps the last bytes of stderr."""

    def __init__(self, max_line: int, on_stderr_line: Any = None) -> None:
        self.max_line = max_line
        self.messages: queue.Queue[Any] = queue.Queue()
        self._buf = bytearray()
        self._err: deque[bytes] = deque()
        self._err_size = 0
        self._err_partial = bytearray()
        self._on_stderr_line = on_stderr_line
        self.broken = False

    def stdout(self, data: bytes) -> None:
        if self.broken:
            return
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._buf += data[start:]
                if len(self._buf) > self.max_line:
                    self._break(f"worker sent a line longer than {self.max_line} bytes")
                return
            self._buf += data[start:nl]
            start = nl + 1
            line, self._buf = bytes(self._buf), bytearray()
            if len(line) > self.max_line:
                self._break(f"worker sent a line longer than {self.max_line} bytes")
                return
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self._break("worker sent a line that is not JSON")
                return
            if not isinstance(msg, dict | list):
                self._break("worker sent JSON that is not a JSON-RPC message")
                return
            self.messages.put(msg)

    def _break(self, reason: str) -> None:
        self.broken = True
        self._buf = bytearray()
        self.messages.put(Broken(reason))

    def stderr(self, data: bytes) -> None:
        self._err.append(data)
        self._err_size += len(data)
        while self._err_size > STDERR_TAIL_BYTES and len(self._err) > 1:
            self._err_size -= len(self._err.popleft())
        if self._on_stderr_line is not None:
            self._err_partial += data
            *lines, rest = self._err_partial.split(b"\n")
            self._err_partial = bytearray(rest[-STDERR_TAIL_BYTES:])
            for ln in lines:
                self._on_stderr_line(ln[:4096].decode("utf-8", errors="replace"))

    def stderr_tail(self, limit: int = 4096) -> str:
        return b"".join(self._err)[-limit:].decode("utf-8", errors="replace")

    def eof(self) -> None:
        self.messages.put(EOF_MARK)


class DockerAttachTransport:
    """The attach socket of a container started without a TTY (multiplexed streams)."""

    def __init__(self, sock: socket.socket, parser: StreamParser, closer: Any = None) -> None:
        self._sock = sock
        self._closer = closer
        self.parser = parser
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="toolcage-attach-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        """Demultiplex Docker's 8-byte-header frames from one buffered stream of recv() calls.

        One recv per burst, not two per frame: fewer syscalls and fewer GIL hand-offs on the
        call path. A frame's payload is handed on in pieces, so memory stays bounded by the
        parser's line cap, not by the frame size the container claims.
        """
        buf = bytearray()
        stream = 0
        remaining = 0  # payload bytes of the current frame still to come
        try:
            while True:
                try:
                    chunk = self._sock.recv(1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
                pos = 0
                while pos < len(buf):
                    if remaining == 0:
                        if len(buf) - pos < 8:
                            break
                        stream = buf[pos]
                        remaining = struct.unpack_from(">I", buf, pos + 4)[0]
                        pos += 8
                        continue
                    take = min(remaining, len(buf) - pos)
                    piece = bytes(buf[pos : pos + take])
                    pos += take
                    remaining -= take
                    if stream == 1:
                        self.parser.stdout(piece)
                    elif stream == 2:
                        self.parser.stderr(piece)
                del buf[:pos]
        finally:
            self.parser.eof()

    def send(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        try:
            if self._closer is not None:
                self._closer()
            self._sock.close()
        except OSError:
            pass


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

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

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
