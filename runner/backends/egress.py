"""Per-run egress plumbing for ``network.mode: proxy``: a socket volume, the egress proxy, its live decisions.

The sandbox keeps no network interface but ``lo``. The egress proxy runs in its own
hardened container whose one network is the egress network (the operator's
``--egress-network``, or a per-run bridge made here) and listens on a Unix socket in a
per-run tmpfs volume, mounted read-only into the sandbox; the worker relays
127.0.0.1:3128 to that socket. (A Docker ``internal`` network between sandbox and proxy
was the first design; its bridge still delivers packets to the host's own addresses,
e.g. 172.17.0.1, so it was dropped.) Every object carries the run's labels and is
removed with the run.

Threat: egress hidden from the audit log. The runner attaches to the proxy's stdout
before it starts and hands each decision to a callback as it arrives (the Sandbox writes
it to the audit log at once), instead of reading the container's size-capped json-file
log at teardown, which a flood of denied requests could rotate away and which a killed
runner or ``--keep`` never read.

Threat: a sandbox growing the runner or the host's disk by flooding its proxy with refused
requests. Nothing here grows with the flood: the last KEEP_DECISIONS decisions are kept (for
debugging), the log has the first LOG_REFUSALS refusals and then one in LOG_EVERY, and the
audit log folds a run's refusals into counts after the first ones (``toolcage.lifecycle.records``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from toolcage.backends.base import Background
from toolcage.engine.api import EngineAPI
from toolcage.engine.attach import DockerAttachTransport
from toolcage.engine.hostconfig import PROXY_PORT, SANDBOX_UID, proxy_container_config
from toolcage.engine.labels import LABEL_PREFIX, RunSpec, labels
from toolcage.errors import SandboxError, UsageError
from toolcage.lifecycle import records
from toolcage.policies import Policy, contract
from toolcage.rpc.transport import StreamParser

READY_TIMEOUT_S = 15.0
UPDATE_TIMEOUT_S = 5.0  # a live policy change: sent, applied and confirmed by the proxy
DRAIN_TIMEOUT_S = 5.0
# the proxy's own exit on SIGTERM, its queued decisions written (then SIGKILL). 2 s lost a refusal's record
# once in CI on a loaded machine; a proxy that exits at once costs nothing of it
STOP_GRACE_S = 5.0
MAX_LINE = 64 * 1024  # the proxy cuts its fields to 512 chars; anything longer is not one of its records
MAX_FIELD = 512
KEEP_DECISIONS = 256  # the last decisions, kept for debugging and tests (the audit log has them all)
LOG_REFUSALS, LOG_EVERY = 100, 1000  # refusals logged one by one, then one in LOG_EVERY (with the count)
OnRecord = Callable[[dict[str, Any]], None]


def _clip(value: Any) -> Any:
    """Defence in depth: the proxy already cuts long fields; the runner does not rely on it."""
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return f"{value[:MAX_FIELD]}…[truncated {len(value) - MAX_FIELD} chars]"
    if isinstance(value, list):
        return [_clip(v) for v in value[:16]]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return _clip(str(value))


class DecisionStream(StreamParser):
    """The proxy's stdout as JSON records (bounded lines; anything else is ignored, never fatal).

    A StreamParser, so DockerAttachTransport demultiplexes Docker's frames for it; stderr
    keeps its bounded tail for error messages."""

    def __init__(self, on_record: OnRecord, redact: Callable[[Any], Any] | None = None) -> None:
        super().__init__(MAX_LINE)
        self._on_record = on_record
        self._redact_record = redact or (lambda rec: rec)
        self.ended = threading.Event()

    def stdout(self, data: bytes | memoryview) -> None:
        for line in self._lines.feed(data):
            if line is None:
                continue  # over-long: not one of the proxy's records, and never fatal here
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("event"), str):
                # the run's secrets redacted before the cut: over http the proxy sees whole URLs, and a bound
                # host's redirect can carry the value it got (the proxy, which holds none, cuts at 512 itself)
                rec = self._redact_record(rec)
                self._on_record({k: _clip(v) for k, v in rec.items() if isinstance(k, str)})

    def eof(self) -> None:
        self.ended.set()


def volume_name(run_id: str) -> str:
    """The run's proxy socket volume (decided with the run's spec, made by ``Egress.prepare``)."""
    return f"toolcage-sock-{run_id}"


def sandbox_env() -> dict[str, str]:
    """What the sandbox's environment gets for the proxy: tools that honour the usual variables find
    the worker's relay at 127.0.0.1:PROXY_PORT."""
    url = f"http://127.0.0.1:{PROXY_PORT}"
    return {
        contract.ENV_PROXY: f"127.0.0.1:{PROXY_PORT}",
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def audit_decisions(audit: Any, run_id: str) -> OnRecord | None:
    """A callback that writes each proxy decision to the audit log as it arrives (``event_later``:
    on disk within the audit writer's batch window, so a runner killed later keeps them)."""
    if audit is None:
        return None

    def write(rec: dict[str, Any]) -> None:
        event = rec.get("event")
        if event == "egress.dropped":
            count = rec.get("count")
            if records.admit_dropped(audit, run_id, count if isinstance(count, int) and count > 0 else 0):
                audit.event_later("egress.dropped", run_id=run_id, source="proxy", count=count)
        elif event in ("egress.allowed", "egress.denied"):
            if event == "egress.denied" and not records.admit_refusal(
                audit, run_id, "proxy", rec.get("reason"), rec.get("target")
            ):
                return  # counted: in the run's next egress.refusals_folded
            audit.event_later(
                "egress.decision",
                run_id=run_id,
                source="proxy",
                allowed=event == "egress.allowed",
                target=rec.get("target"),
                method=rec.get("method"),
                reason=rec.get("reason"),
                addresses=rec.get("addresses"),
                sni=rec.get("sni"),
            )

    return write


class Egress:
    def __init__(
        self,
        engine: EngineAPI,
        policy: Policy,
        run: RunSpec,
        egress_network: str | None,
        upstream: str | None,
        log: Any,
        on_decision: OnRecord | None = None,
        proxy_image: str | None = None,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        self.engine = engine
        # the proxy enforces the allowlist, so it runs from the worker image itself, never from the
        # run's own (--image / --pip): packages or files added there cannot reach the proxy's code
        self.proxy_image = proxy_image or run.image
        self.policy = policy
        self.run = run
        self.requested_egress = egress_network
        self.upstream = upstream
        self.log = log
        self.on_decision = on_decision
        self.volume = run.proxy_volume or volume_name(run.run_id)
        self.egress = egress_network or f"toolcage-egress-{run.run_id}"
        self.proxy_name = f"toolcage-proxy-{run.run_id}"
        self.proxy_id: str | None = None
        self._networks: list[str] = []
        self._network_made: Background | None = None  # the egress network's creation (prepare's), until joined
        self._volume_made = False
        self._ready = threading.Event()
        self._stream = DecisionStream(self._on_record, redact)
        self._transport: DockerAttachTransport | None = None
        self.decisions: deque[dict[str, Any]] = deque(maxlen=KEEP_DECISIONS)
        self._refusals = 0
        # live policy changes (update): the answers by seq, and one change at a time
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition()
        self._seq = 0
        self._updating = threading.Lock()

    def _on_record(self, rec: dict[str, Any]) -> None:
        """Runs on the attach reader thread, once per line the proxy writes."""
        event = str(rec.get("event"))
        if event == "proxy.listening":
            self._ready.set()
        if event in ("policy.applied", "policy.refused") and isinstance(rec.get("seq"), int):
            with self._answered:
                if rec["seq"] == self._seq:  # the change asked now, never an old or forged number
                    self._answers[rec["seq"]] = rec
                    self._answered.notify_all()
            return
        if not event.startswith("egress."):
            return
        self.decisions.append(rec)
        if event == "egress.denied":
            self._refusals += 1
        n = self._refusals
        if event != "egress.denied" or n <= LOG_REFUSALS or n % LOG_EVERY == 0:
            fields = {k: v for k, v in rec.items() if k not in ("event", "timestamp", "run_id")}
            self.log.info(event, **fields, **({"count": n} if n > LOG_REFUSALS and event == "egress.denied" else {}))
        if self.on_decision is not None:
            try:
                self.on_decision(rec)
            except Exception as exc:  # the reader must go on: the next record may be the one that matters
                self.log.error("egress.audit_failed", error=type(exc).__name__)

    def up(self) -> tuple[str, dict[str, str]]:
        """Create the volume (and egress network), start the proxy; return the volume and the sandbox's env."""
        out = self.prepare()
        self.launch()
        return out

    def prepare(self) -> tuple[str, dict[str, str]]:
        """Create the volume; return it and the sandbox's env. The sandbox may start once this returns: it has
        no network, only the volume (the proxy's socket). The egress network, which only the proxy joins and
        which is the slow one (69 ms against the volume's 7 in bench.split_proxy), is made meanwhile on a thread
        of its own, and :meth:`launch` waits for it. A requested network that does not exist is refused here."""
        lab = {**labels(self.policy, self.run), f"{LABEL_PREFIX}role": "egress"}
        if self.requested_egress is not None:
            if self.engine.network(self.requested_egress) is None:
                raise UsageError(f"egress network {self.requested_egress!r} does not exist (docker network ls)")
        else:

            def network() -> None:
                self.engine.create_network(self.egress, internal=False, labels=lab)
                self._networks.append(self.egress)

            self._network_made = Background(network, "toolcage-egress-network")
        try:
            # Podman 4.3 reads a tmpfs volume's size= as a quota and refuses it ("Filesystem does not support
            # Project Quota"): there the volume has no size of its own. Only the proxy writes to it (a socket),
            # and what a tmpfs holds is charged to the memory limit of the container that wrote it.
            size = "size=1m," if self.run.flavor.volume_size else ""
            self.engine.create_tmpfs_volume(
                self.volume, lab, f"{size}uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700,nosuid,nodev,noexec"
            )
            self._volume_made = True
        except BaseException:
            with contextlib.suppress(BaseException):
                self._network_joined()  # known before the caller's clean-up removes what was made
            raise
        return self.volume, sandbox_env()

    def _network_joined(self) -> None:
        """Wait for the egress network's creation, if prepare started one; raise what it raised."""
        made, self._network_made = self._network_made, None
        if made is not None:
            made.join()

    def launch(self) -> None:
        """Create, attach and start the proxy, and wait until it listens. The sandbox may start at the
        same time (the volume is mounted without copy-up: hostconfig._proxy_volume_mount)."""
        self._network_joined()
        # the sandbox's shared files are its image's: the proxy mounts them only when it runs that image too
        shared = self.run.shared_files if self.proxy_image == self.run.image else ()
        run = dataclasses.replace(self.run, proxy_volume=self.volume, image=self.proxy_image, shared_files=shared)
        cfg = proxy_container_config(self.policy, run, self.egress, self.upstream)
        self.proxy_id = self.engine.create(cfg, self.proxy_name)
        # attached before start, so not one line of the decision stream is missed
        sock, closer = self.engine.attach(self.proxy_id)
        self._transport = DockerAttachTransport(sock, self._stream, closer)
        self._transport.start()
        self.engine.start(self.proxy_id)
        self._wait_ready()
        self.log.info("egress.up", egress=self.egress, proxy=self.proxy_name, volume=self.volume)

    def update(self, policy: Policy, timeout: float = UPDATE_TIMEOUT_S) -> dict[str, Any]:
        """Replace the proxy's policy with ``policy`` (checked by the caller) and return its answer once it is in
        force: ``{"sha256", "cut", "audit_only"}``, cut being the relayed connections it ended. SandboxError if the
        proxy refused it or did not answer within ``timeout`` (then the old policy may still hold)."""
        if self._transport is None or self.proxy_id is None:
            raise SandboxError("the egress proxy is not running")
        with self._updating:
            with self._answered:
                self._seq += 1
                seq = self._seq
            line = json.dumps({"seq": seq, "policy": json.loads(policy.canonical_json())}, separators=(",", ":"))
            deadline = time.monotonic() + timeout
            self._transport.send(line.encode() + b"\n", deadline)
            with self._answered:
                while seq not in self._answers:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stream.ended.is_set():
                        raise SandboxError(f"the egress proxy did not confirm the policy change within {timeout:g} s")
                    self._answered.wait(min(left, 0.1))
                answer = self._answers.pop(seq)
        if answer.get("event") == "policy.refused":
            raise SandboxError(f"the egress proxy refused the policy change: {answer.get('reason')}")
        if answer.get("sha256") != policy.sha256():
            raise SandboxError("the egress proxy applied another policy than the one sent")
        return {"sha256": answer["sha256"], "cut": answer.get("cut", 0), "audit_only": bool(answer.get("audit_only"))}

    def _wait_ready(self) -> None:
        """The proxy's ``proxy.listening`` line on the decision stream, or its stderr if it died first."""
        waited = 0.0
        while waited < READY_TIMEOUT_S:
            if self._ready.wait(0.05):
                return
            if self._stream.ended.is_set():
                break
            waited += 0.05
        tail = self._stream.stderr_tail(500).strip()
        raise SandboxError(f"the egress proxy did not start: {tail}")

    def stop(self) -> None:
        """Stop the proxy and read its stream to the end, removing nothing (``--keep``: the run's objects
        stay for inspection, but no proxy stays live to relay for anything left in the sandbox)."""
        self._end_proxy()
        if self._transport is not None:
            self._transport.close()
        records.flush_refusals(self.run.run_id)

    def _end_proxy(self) -> None:
        """SIGTERM, so the proxy writes the decisions it still holds and exits; SIGKILL if it has not within
        STOP_GRACE_S. Either way its stream is read to the end (at most DRAIN_TIMEOUT_S more)."""
        if self.proxy_id is None:
            return
        self.engine.kill(self.proxy_id, signal="SIGTERM")
        if not self._stream.ended.wait(STOP_GRACE_S):
            # its last decisions may be lost: said, so a missing audit record has its reason in the log
            self.log.warning("egress.proxy_killed", proxy=self.proxy_name, grace_s=STOP_GRACE_S)
            self.engine.kill(self.proxy_id)
            self._stream.ended.wait(DRAIN_TIMEOUT_S)

    def down(self, before_volume: Callable[[], None] | None = None) -> None:
        """Stop the proxy, read its stream to the end, then remove it, the volume and any network made here.
        ``before_volume`` (the sandbox's own removal, run meanwhile) must end before the volume goes."""
        try:
            if self.proxy_id is not None:
                self._end_proxy()  # the last decisions arrive before the stream ends
                self.engine.remove(self.proxy_id)
            if self._transport is not None:
                self._transport.close()
            records.flush_refusals(self.run.run_id)  # the counts since the last flush, now
        finally:
            if before_volume is not None:
                before_volume()
        if self._volume_made:
            self.engine.remove_volume(self.volume)
        with contextlib.suppress(BaseException):
            self._network_joined()  # a launch that never ran: the network is made (or not) before it is removed
        for net in reversed(self._networks):
            self.engine.remove_network(net)
