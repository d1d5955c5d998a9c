"""Per-run egress plumbing for ``network.mode: proxy``: a socket volume, the egress proxy, teardown.

The sandbox keeps no network interface but ``lo``. The egress proxy runs in its own
hardened container whose one network is the egress network (the operator's
``--egress-network``, or a per-run bridge made here) and listens on a Unix socket in a
per-run tmpfs volume, mounted read-only into the sandbox; the worker relays
127.0.0.1:3128 to that socket. So the sandbox has no route to the host, the LAN or the
egress network: its only way out is the proxy's allowlist. (A Docker ``internal`` network
between sandbox and proxy was the first design; its bridge still delivers packets to the
host's own addresses, e.g. 172.17.0.1, so it was dropped.) Every object carries the run's
labels and is removed with the run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from policies import Policy
from runner.config import LABEL_PREFIX, PROXY_PORT, SANDBOX_UID, RunSpec, labels, proxy_container_config
from runner.errors import SandboxError, UsageError

READY_TIMEOUT_S = 15.0


class Egress:
    def __init__(
        self, engine: Any, policy: Policy, run: RunSpec, egress_network: str | None, upstream: str | None, log: Any
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.run = run
        self.requested_egress = egress_network
        self.upstream = upstream
        self.log = log
        self.volume = f"toolcage-sock-{run.run_id}"
        self.egress = egress_network or f"toolcage-egress-{run.run_id}"
        self.proxy_name = f"toolcage-proxy-{run.run_id}"
        self.proxy_id: str | None = None
        self._networks: list[str] = []
        self._volume_made = False
        self.decisions: list[dict[str, Any]] = []

    def up(self) -> tuple[str, dict[str, str]]:
        """Create the volume (and egress network), start the proxy; return the volume and the sandbox's env."""
        lab = {**labels(self.policy, self.run), f"{LABEL_PREFIX}role": "egress"}
        if self.requested_egress is not None:
            if self.engine.network(self.requested_egress) is None:
                raise UsageError(f"egress network {self.requested_egress!r} does not exist (docker network ls)")
        else:
            self.engine.create_network(self.egress, internal=False, labels=lab)
            self._networks.append(self.egress)
        self.engine.create_tmpfs_volume(
            self.volume, lab, f"size=1m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700,nosuid,nodev,noexec"
        )
        self._volume_made = True
        run = dataclasses.replace(self.run, proxy_volume=self.volume)
        cfg = proxy_container_config(self.policy, run, self.egress, self.upstream)
        self.proxy_id = self.engine.create(cfg, self.proxy_name)
        self.engine.start(self.proxy_id)
        self._wait_ready()
        url = f"http://127.0.0.1:{PROXY_PORT}"
        env = {
            "TOOLCAGE_PROXY": f"127.0.0.1:{PROXY_PORT}",
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
        }
        self.log.info("egress.up", egress=self.egress, proxy=self.proxy_name, volume=self.volume)
        return self.volume, env

    def _wait_ready(self) -> None:
        assert self.proxy_id is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if "proxy.listening" in self.engine.logs(self.proxy_id, tail=20):
                return
            state = (self.engine.inspect(self.proxy_id) or {}).get("State", {})
            if state.get("Status") == "exited":
                break
            time.sleep(0.01)
        tail = self.engine.logs(self.proxy_id, tail=20)
        raise SandboxError(f"the egress proxy did not start: {tail.strip()[-500:]}")

    def down(self) -> None:
        """Relay the proxy's decisions to the log, then remove the proxy, the volume and any network made here."""
        if self.proxy_id is not None:
            for line in self.engine.logs(self.proxy_id).splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if str(rec.get("event", "")).startswith("egress."):
                    self.decisions.append(dict(rec))
                    event = rec.pop("event")
                    rec.pop("timestamp", None)
                    rec.pop("run_id", None)
                    self.log.info(event, **rec)
            self.engine.remove(self.proxy_id)
        if self._volume_made:
            self.engine.remove_volume(self.volume)
        for net in reversed(self._networks):
            self.engine.remove_network(net)
