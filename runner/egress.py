"""Per-run egress plumbing for ``network.mode: proxy``: an internal network, the egress proxy, teardown.

The sandbox joins only the run's internal network (``internal=True``: Docker gives it no
gateway); the proxy joins that network and the egress network, which is its one route
out. The egress network is the operator's (``--egress-network``) or a per-run bridge made
here. Every object carries the run's labels and is removed with the run.
"""

from __future__ import annotations

import json
import time
from typing import Any

from policies import Policy
from runner.config import LABEL_PREFIX, PROXY_ALIAS, PROXY_PORT, RunSpec, labels, proxy_container_config
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
        self.internal = f"toolcage-net-{run.run_id}"
        self.egress = egress_network or f"toolcage-egress-{run.run_id}"
        self.proxy_name = f"toolcage-proxy-{run.run_id}"
        self.proxy_id: str | None = None
        self._made: list[str] = []
        self.decisions: list[dict[str, Any]] = []

    def up(self) -> tuple[str, dict[str, str]]:
        """Create networks and start the proxy; return the sandbox's network and proxy env."""
        lab = {**labels(self.policy, self.run), f"{LABEL_PREFIX}role": "network"}
        if self.requested_egress is not None:
            if self.engine.network(self.requested_egress) is None:
                raise UsageError(f"egress network {self.requested_egress!r} does not exist (docker network ls)")
        else:
            self.engine.create_network(self.egress, internal=False, labels=lab)
            self._made.append(self.egress)
        self.engine.create_network(self.internal, internal=True, labels=lab)
        self._made.append(self.internal)
        cfg = proxy_container_config(self.policy, self.run, self.egress, self.upstream)
        self.proxy_id = self.engine.create(cfg, self.proxy_name)
        self.engine.connect(self.internal, self.proxy_id, aliases=[PROXY_ALIAS])
        self.engine.start(self.proxy_id)
        ip = self._wait_ready()
        url = f"http://{ip}:{PROXY_PORT}"
        env = {
            "TOOLCAGE_PROXY": f"{ip}:{PROXY_PORT}",
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": "",
            "no_proxy": "",
        }
        self.log.info("egress.up", internal=self.internal, egress=self.egress, proxy=self.proxy_name, proxy_ip=ip)
        return self.internal, env

    def _wait_ready(self) -> str:
        assert self.proxy_id is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if "proxy.listening" in self.engine.logs(self.proxy_id, tail=20):
                info = self.engine.inspect(self.proxy_id) or {}
                nets = info.get("NetworkSettings", {}).get("Networks", {})
                ip = (nets.get(self.internal) or {}).get("IPAddress")
                if ip:
                    return str(ip)
            state = (self.engine.inspect(self.proxy_id) or {}).get("State", {})
            if state.get("Status") == "exited":
                break
            time.sleep(0.02)
        tail = self.engine.logs(self.proxy_id, tail=20)
        raise SandboxError(f"the egress proxy did not start: {tail.strip()[-500:]}")

    def down(self) -> None:
        """Relay the proxy's decisions to the log, then remove the proxy and the run's networks."""
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
        for net in reversed(self._made):
            self.engine.remove_network(net)
