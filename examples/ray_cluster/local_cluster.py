#!/usr/bin/env python3
"""A real Ray cluster on one machine: a head and N worker nodes, each worker node with a Docker engine of its own.

For trying toolcage on a multi-engine cluster on one box, for CI, and for bench/. Run as root, with the
Python that has ``ray`` (the ``toolcage[ray]`` extra), e.g. ``.venv/bin/python``::

    .venv/bin/python examples/ray_cluster/local_cluster.py up --nodes 3 --state /tmp/x   # prints JSON, leaves it up
    .venv/bin/python examples/ray_cluster/local_cluster.py down --state /tmp/x

or from Python::

    with LocalCluster().up(nodes=2, image_on={0}) as c:
        ray.init(address=c.address)
        c.nodes[0].docker("ps")            # node 0's own engine
        c.kill_raylet(1); c.restart_node(1)

Progress goes to stderr; stdout has nothing but the JSON.

What a worker node is
    node k = one ``ray start --block`` (node name ``toolcage-nodeK``, ``--num-cpus 2``, resource
    ``{"toolcage_engine": 1}``) started with DOCKER_HOST=unix://<its engine's socket>,
    TOOLCAGE_AUDIT_LOG=<node dir>/audit.jsonl and XDG_STATE_HOME=<node dir>/state; Ray's workers inherit
    the raylet's environment, so a task on node k talks to node k's engine. The head has ``--num-cpus 0`` and
    no resources, so no task lands there; a driver on this machine attaches to the head's raylet (Ray prefers
    the head among nodes on one host), so killing a worker's raylet never takes the driver down.

Each engine lives in a network namespace of its own
    Every dockerd, on start-up, flushes and re-creates the iptables chains DOCKER, DOCKER-ISOLATION-STAGE-1/2
    (libnetwork's removeIPChains): a second dockerd with iptables on, in the host's network namespace, wipes
    the main engine's rules (its published ports, and the DROP rules that make its ``internal`` networks
    internal) until the main engine restarts. With ``--iptables=false`` instead, an extra engine's
    ``internal`` networks are not internal at all (20.10 gives their containers a default route; only
    iptables keeps them in), and nothing gives its containers a way out. So each extra engine runs under
    ``nsenter --net`` in a namespace ``tclcS`` of its own (S: a free slot, 0-49): its own iptables (Docker's
    full rules, exactly as on a real node), its own bridge ``tcbrS`` (10.(200+S).254.1/24, ``--bridge``), its
    own ``--default-address-pool base=10.(200+S).0.0/17,size=24``, and a veth pair to the host
    (``tcvS``, 10.(200+S).255.253/30 <-> eth0 10.(200+S).255.254) with a default route through it. On the
    host the harness adds three rules of its own, each tagged ``-m comment --comment tclc-<id>``, and
    removes exactly those: FORWARD accept tcvS->uplink and the replies back, and a MASQUERADE of the /30
    out of the uplink. The main engine's docker0, chains and pools are never touched (``ip netns exec`` is
    not used: its fresh mount namespace remounts /sys and loses the cgroup v1 mounts dockerd needs).

The worker image
    ``image_mode="clone"`` (default): one ``docker save | docker load`` streams the image from the source
    engine (the one this process's docker CLI talks to) into the first node that gets it; its storage
    directory and image store are then copied, with hard links (``cp -al``; layers are never written in
    place), into a template, and from there into every other node's data root before its dockerd starts
    (under 1 s a node instead of a ~9 s ``docker load``). ``image_cache=DIR`` (CLI ``--image-cache``) keeps
    that template between clusters (one entry per image id, storage driver and dockerd version; hard links
    when DIR is on the same filesystem), so a later ``up`` streams nothing. ``image_mode="load"``: ``docker
    save`` once to a file, then ``docker load`` into each node in parallel (slowest, kept for comparison).
    ``image_on``: the nodes that get the image (default all): a test can have a node that lacks it. The
    engines use overlay2 when the kernel's overlayfs mounts under the root (it does here, on ext4; the main
    engine's fuse-overlayfs is the fallback), their own managed containerd, and gVisor as runtime ``runsc``
    (the flags of .ci/register-runsc) when runsc is installed.

Ray
    The head runs with a fast node-death detection (``HEALTH_CHECK``, in the head's environment, which its
    gcs_server inherits: a check every 1 s, 2 s for each, dead after 3 failures in a row; Ray's defaults are
    3 s, 10 s, 5, and 5 s before the first check): a SIGKILLed raylet refuses the checks at once, and its node
    was marked dead 2.1-2.8 s after the kill here (13-15 s with Ray's defaults); ``DEATH_BOUND_S`` = 5 s is
    the bound a test can assert. ``--include-dashboard=false`` (Ray still starts a minimal dashboard process;
    it gets a free port, like every port of ours, so clusters never collide). Without the dashboard
    ``ray.util.state`` and the job-submission SDK do not work; what does: ``LocalCluster.jobs()``, i.e.
    ``ray._raylet.GcsClient(address).get_all_job_info()`` (no driver needed: ``is_dead``, ``driver_pid``),
    ``ray._private.state.state.job_table()`` in a connected driver, and ``ray.nodes()``.
    Token authentication (Ray's default for new clusters in this Ray): every node runs with
    RAY_AUTH_MODE=token and Ray's own token lookup (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, else
    ~/.ray/auth_token, made if missing as ``ray start --head`` would), so nobody else on the network can use
    the cluster (its GCS and raylets listen on every interface). A driver given an explicit address must
    itself set RAY_AUTH_MODE=token (``LocalCluster.env``; Ray only turns it on by itself for
    ``address="auto"``): ``up()`` sets it in this process's environment, and ``down()`` restores it.
    Each node has its own ``--temp-dir`` (two ``ray start`` sharing one race for the same socket names, and
    one raylet dies of "bind: Address already in use"). Worker nodes start without a log monitor (a second or
    two faster; tasks' output stays in the node's Ray logs): ``log_monitor=True`` forwards it to drivers.

Start-up on this 2-core machine (load 4-7, most of it these runs' own), 1/2/3 worker nodes with the image on
each: 14-19/19-21/23-24 s; with a filled image cache 10/10/12 s; ``image_mode="load"``, 3 nodes: 31 s. The
image stream (10-15 s while Ray starts beside it) is the long pole without a cache; Ray (head, then the
workers) with one. ``down()`` takes 2-5 s.

Teardown kills exactly what the harness started: every process it starts carries
TOOLCAGE_LOCAL_CLUSTER=<id>/<role>/ in its environment (inherited by raylets, Ray workers, containerd and
shims), so ``down()`` never uses ``ray stop`` (which stops every Ray on the machine) nor any name match; then
it removes its mounts, its iptables rules (by their exact spec), veths, namespaces and directories.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_IMAGE = "toolcage-worker:0.1.0"
ENGINE_RESOURCE = "toolcage_engine"
NODE_CPUS = 2
# The head's GCS (env of the head's ray start, inherited by gcs_server): a raylet that stops answering is dead
# after failure_threshold checks, period_ms apart, each given timeout_ms; a SIGKILLed raylet refuses at once.
HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}
DEATH_BOUND_S = 5.0
# As .ci/register-runsc registers gVisor with the main engine.
RUNSC_ARGS = ["--network=none", "--platform=ptrace", "--oci-seccomp", "--overlay2=none", "--host-uds=all"]
MARKER = "TOOLCAGE_LOCAL_CLUSTER"
SLOTS = range(50)  # 10.200.0.0/16 .. 10.249.0.0/16
STATE_FILE = "cluster.json"

_CLOCK = [time.monotonic()]


class ClusterError(RuntimeError):
    """The cluster could not be brought up (or a step on it failed); the message says why."""


def log(msg: str) -> None:
    print(f"local_cluster [{time.monotonic() - _CLOCK[0]:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


@dataclass
class Proc:
    """A process we started, known by pid and start time (so a reused pid is never mistaken for it)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Proc:
        st = _stat(pid)
        return cls(pid, st[2] if st else -1)

    def alive(self) -> bool:
        st = _stat(self.pid)
        return st is not None and st[2] == self.start and st[4] != "Z"


def _stat(pid: int) -> tuple[int, int, int, str, str] | None:
    """(ppid, pgid, starttime, comm, state) of a process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    f = raw[raw.rindex(")") + 2 :].split()
    return int(f[1]), int(f[2]), int(f[19]), comm, f[0]


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for p in _pids():
        st = _stat(p)
        if st and st[0] == pid:
            out.append((p, st[3]))
    return out


def marked(cluster_id: str, role: str = "") -> list[int]:
    """Live processes whose environment has TOOLCAGE_LOCAL_CLUSTER=<cluster_id>/<role...>."""
    needle = f"{MARKER}={cluster_id}/{role}".encode()  # roles end with "/": engine1/ is not engine10/
    out = []
    for p in _pids():
        if p == os.getpid():
            continue
        try:
            env = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:
            continue
        if any(e.startswith(needle) for e in env.split(b"\0")):
            st = _stat(p)
            if st and st[4] != "Z":
                out.append(p)
    return out


def _signal(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def _wait_gone(check: Callable[[], bool], timeout: float) -> bool:
    """Poll until check() is False; True when it went False in time."""
    end = time.monotonic() + timeout
    while check():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _run(cmd: list[str], *, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        said = "\n".join((r.stderr or r.stdout).strip().splitlines()[-10:])
        raise ClusterError(f"`{' '.join(cmd)}` failed (exit {r.returncode}): {said}")
    return r


def _tail(path: str | Path, lines: int = 15) -> str:
    """The end of a log, without dockerd's gRPC chatter."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join([t for t in text if "module=grpc" not in t][-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ping(sock: str) -> bool:
    """The engine at this Unix socket answers GET /_ping."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(sock)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            head = s.recv(256)
    except OSError:
        return False
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) > 1 and status[0].startswith(b"HTTP/1.") and status[1] == b"200"


# ---------------------------------------------------------------- nodes


@dataclass
class Node:
    """One worker node: its Ray node and its own Docker engine."""

    index: int
    slot: int
    dir: str
    socket: str
    exec_root: str
    has_image: bool
    node_id: str | None = None
    gen: int = 0
    ray: Proc | None = None
    dockerd: Proc | None = None
    engine_t0: float = field(default=0.0, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"toolcage-node{self.index}"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def audit_log(self) -> str:
        return os.path.join(self.dir, "audit.jsonl")

    @property
    def state_home(self) -> str:
        return os.path.join(self.dir, "state")

    @property
    def ray_log(self) -> str:
        """The output of this incarnation's ray start (one file each: a restart never reads an older one's)."""
        return os.path.join(self.dir, "ray.log" if self.gen == 0 else f"ray-{self.gen}.log")

    @property
    def data_root(self) -> str:
        return os.path.join(self.dir, "docker")

    @property
    def netns(self) -> str:
        return f"tclc{self.slot}"

    @property
    def veth(self) -> str:
        return f"tcv{self.slot}"

    @property
    def bridge(self) -> str:
        return f"tcbr{self.slot}"

    @property
    def net16(self) -> str:
        return f"10.{200 + self.slot}"

    def docker(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float | None = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this node's engine; returns the CompletedProcess (text)."""
        cmd = ["docker", "-H", self.docker_host, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout, env=_docker_env())
        if check and r.returncode != 0:
            raise ClusterError(f"`{' '.join(cmd)}` failed (exit {r.returncode}): {r.stderr.strip()}")
        return r

    def ping(self) -> bool:
        return _ping(self.socket)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "node_id": self.node_id,
            "docker_host": self.docker_host,
            "socket": self.socket,
            "dir": self.dir,
            "audit_log": self.audit_log,
            "state_home": self.state_home,
            "has_image": self.has_image,
            "slot": self.slot,
            "netns": self.netns,
            "exec_root": self.exec_root,
            "gen": self.gen,
            "ray": vars(self.ray) if self.ray else None,
            "dockerd": vars(self.dockerd) if self.dockerd else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Node:
        return cls(
            index=d["index"],
            slot=d["slot"],
            dir=d["dir"],
            socket=d["socket"],
            exec_root=d["exec_root"],
            has_image=d["has_image"],
            node_id=d["node_id"],
            gen=d["gen"],
            ray=Proc(**d["ray"]) if d["ray"] else None,
            dockerd=Proc(**d["dockerd"]) if d["dockerd"] else None,
        )


def _docker_env() -> dict[str, str]:
    """This process's environment for a docker CLI told its engine with -H (no DOCKER_HOST/DOCKER_CONTEXT)."""
    return {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY")}


# ---------------------------------------------------------------- the cluster


class LocalCluster:
    """A head and worker nodes, each worker with its own dockerd; see the module's docstring.

    ``LocalCluster(root=None)``: root is the cluster's directory (state file, node dirs, data roots); None:
    a new one under /var/tmp, removed by down(). ``up()`` returns self; ``down()`` is idempotent; the
    object is a context manager (down() on exit).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        cpus: int = NODE_CPUS,
        object_store_mb: int = 256,
        image_mode: str = "clone",
        image_cache: str | os.PathLike[str] | None = None,
        log_monitor: bool = False,
        health_check: dict[str, str] | None = None,
    ) -> None:
        if image_mode not in ("clone", "load"):
            raise ValueError("image_mode is 'clone' or 'load'")
        self.id = secrets.token_hex(4)
        self.root = str(Path(root).resolve()) if root is not None else ""
        self.root_created = False
        self.image = image
        self.image_id: str | None = None
        self.image_mode = image_mode
        self.image_cache = str(image_cache) if image_cache else None
        self._tpl: Path | None = None
        self.log_monitor = log_monitor
        self.cpus = cpus
        self.object_store_mb = object_store_mb
        self.health_check = dict(HEALTH_CHECK if health_check is None else health_check)
        self.run_dir = f"/run/tclc-{self.id}"
        self.ray_dir = f"/tmp/tclc-{self.id}"
        self.port = 0
        self.head: Proc | None = None
        self.nodes: list[Node] = []
        self.rules: list[list[str]] = []  # iptables args after -A/-D: [table, chain, *spec]
        self.uplink: str | None = None
        self.mtu = 1500
        self.storage_driver = ""
        self.runtimes: dict[str, Any] = {}
        self.startup_s: float | None = None
        self._popen: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()
        self._gcs: Any = None
        self._env_saved: dict[str, str | None] = {}
        self._is_up = False
        self._down = False

    # -- public

    @property
    def address(self) -> str:
        """For ray.init(address=...)."""
        return f"127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a driver process needs besides the address (Ray finds the token itself, as for its nodes)."""
        return {"RAY_AUTH_MODE": "token"}

    @property
    def tag(self) -> str:
        return f"tclc-{self.id}"

    def node(self, k: int) -> Node:
        for n in self.nodes:
            if n.index == k:
                return n
        raise KeyError(f"no node {k}")

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, nodes: int = 3, image_on: Iterable[int] | None = None) -> LocalCluster:
        """Bring up the head and `nodes` worker nodes; the image goes to the nodes in image_on (None: all).
        A failure tears down what was started and raises ClusterError saying why."""
        if self._is_up or self._down:
            raise ClusterError("up() runs once per LocalCluster")
        _CLOCK[0] = time.monotonic()
        t0 = time.monotonic()
        want = set(range(nodes)) if image_on is None else set(image_on)
        self._preflight(need_image=bool(want & set(range(nodes))))
        if self.root and (Path(self.root) / STATE_FILE).exists():
            raise ClusterError(f"{self.root} already holds a cluster ({STATE_FILE}): down it first")
        self._is_up = True
        try:
            self._up(nodes, want)
        except BaseException as exc:
            log(f"start-up failed: {exc}; tearing down what was started")
            try:
                self.down()
            except Exception as down_exc:
                log(f"teardown after the failure also failed: {down_exc}")
            if isinstance(exc, ClusterError) or not isinstance(exc, Exception):
                raise
            raise ClusterError(f"start-up failed: {exc!r}") from exc
        self.startup_s = round(time.monotonic() - t0, 2)
        self._save()
        log(f"cluster up in {self.startup_s:.1f}s: address {self.address}, {len(self.nodes)} worker nodes")
        return self

    def add_node(self, image: bool = True) -> Node:
        """A worker node joining later (next index), with its own engine, with the image or not."""
        self._need_up()
        k = max((n.index for n in self.nodes), default=-1) + 1
        n = self._new_node(k, image)
        try:
            self._engine_up(n)
            self._start_node_ray(n)
            self._wait_started(n)
            n.node_id = self._wait_node_id(n.name, exclude=set())
        finally:
            self._save()
        log(f"{n.name} joined: ray node {n.node_id}")
        return n

    def kill_raylet(self, k: int) -> float:
        """SIGKILL node k's raylet (only it); returns time.monotonic() of the kill."""
        n = self.node(k)
        if n.ray is None or not n.ray.alive():
            raise ClusterError(f"{n.name} has no ray start running")
        raylets = [p for p, comm in _children(n.ray.pid) if comm == "raylet"]
        if not raylets:
            raise ClusterError(f"{n.name} has no raylet (children of pid {n.ray.pid})")
        t = time.monotonic()
        os.kill(raylets[0], signal.SIGKILL)
        log(f"{n.name}: raylet pid {raylets[0]} SIGKILLed")
        return t

    def node_alive(self, k: int) -> bool:
        """What the GCS says of node k's current Ray node id."""
        n = self.node(k)
        info = self._node_infos().get(n.node_id or "")
        return bool(info and info["alive"])

    def wait_node_dead(self, k: int, timeout: float = 30.0) -> float:
        """Poll the GCS until node k's Ray node is dead; the seconds it took."""
        t = time.monotonic()
        while self.node_alive(k):
            if time.monotonic() - t > timeout:
                raise ClusterError(f"node {k} still alive after {timeout}s")
            time.sleep(0.05)
        return time.monotonic() - t

    def restart_node(self, k: int) -> str:
        """ray start again for node k (same engine, same env); it gets a new Ray node id; returns it."""
        self._need_up()
        n = self.node(k)
        old = n.node_id
        if n.ray is not None:
            self._stop_group(n.ray, f"{n.name}'s ray start")
        # what is left of the old incarnation (its workers are in process groups of their own)
        for _ in range(50):
            left = marked(self.id, f"node{k}/")
            if not left:
                break
            _signal(left, signal.SIGKILL)
            time.sleep(0.1)
        n.gen += 1
        self._start_node_ray(n)
        self._wait_started(n)
        n.node_id = self._wait_node_id(n.name, exclude={old} if old else set())
        self._save()
        log(f"{n.name} restarted: ray node {old} -> {n.node_id}")
        return n.node_id

    def stop_engine(self, k: int, timeout: float = 20.0) -> None:
        """SIGTERM node k's dockerd (it stops its containers and its containerd); SIGKILL after timeout."""
        n = self.node(k)
        if n.dockerd is not None:
            self._stop_dockerds([n], timeout)
        n.dockerd = None
        self._save()

    def start_engine(self, k: int) -> None:
        """Start node k's dockerd again: same namespace, data root, socket."""
        n = self.node(k)
        if n.dockerd is not None and n.dockerd.alive():
            raise ClusterError(f"{n.name}'s engine is running")
        self._start_dockerd(n)
        self._wait_engine(n)
        self._save()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "address": self.address,
            "env": self.env,
            "root": self.root,
            "root_created": self.root_created,
            "run_dir": self.run_dir,
            "ray_dir": self.ray_dir,
            "port": self.port,
            "image": self.image,
            "image_id": self.image_id,
            "image_mode": self.image_mode,
            "image_cache": self.image_cache,
            "log_monitor": self.log_monitor,
            "storage_driver": self.storage_driver,
            "runtimes": sorted(self.runtimes),
            "uplink": self.uplink,
            "mtu": self.mtu,
            "cpus": self.cpus,
            "object_store_mb": self.object_store_mb,
            "health_check": self.health_check,
            "startup_s": self.startup_s,
            "head": vars(self.head) if self.head else None,
            "nodes": [n.to_json() for n in self.nodes],
            "rules": self.rules,
        }

    @classmethod
    def from_state(cls, root: str | os.PathLike[str]) -> LocalCluster:
        """The cluster whose state file is in root (made by `up` in another process), e.g. to down() it."""
        path = Path(root) / STATE_FILE
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state at {path}") from None
        c = cls(
            d["root"],
            image=d["image"],
            cpus=d["cpus"],
            object_store_mb=d["object_store_mb"],
            image_cache=d.get("image_cache"),
            log_monitor=d.get("log_monitor", False),
        )
        c.id, c.root_created, c.run_dir, c.ray_dir = d["id"], d["root_created"], d["run_dir"], d["ray_dir"]
        c.port, c.image_id, c.image_mode = d["port"], d["image_id"], d["image_mode"]
        c.storage_driver, c.uplink, c.mtu = d["storage_driver"], d["uplink"], d["mtu"]
        c.health_check, c.startup_s, c.rules = d["health_check"], d["startup_s"], d["rules"]
        c.head = Proc(**d["head"]) if d["head"] else None
        c.nodes = [Node.from_json(n) for n in d["nodes"]]
        c._is_up = True
        return c

    # -- start-up

    def _preflight(self, need_image: bool) -> None:
        if os.geteuid() != 0:
            raise ClusterError(
                "local_cluster must run as root: it starts dockerd, makes network namespaces, veth pairs and "
                "iptables rules (e.g. sudo .venv/bin/python examples/ray_cluster/local_cluster.py up ...)"
            )
        missing = [b for b in ("dockerd", "docker", "ip", "iptables", "nsenter") if shutil.which(b) is None]
        if missing:
            raise ClusterError(f"needed on PATH and missing: {', '.join(missing)}")
        if not self._ray_bin().exists():
            raise ClusterError(f"no `ray` next to {sys.executable}: install ray (pip install 'toolcage[ray]')")
        if need_image:
            r = _run(["docker", "image", "inspect", "--format", "{{.Id}}", self.image], check=False)
            if r.returncode != 0:
                source = os.environ.get("DOCKER_HOST") or "default"
                raise ClusterError(
                    f"the image {self.image} is not in the source engine ({source}): build it first"
                    f" (toolcage image build), or give image_on=set(): {r.stderr.strip()}"
                )
            self.image_id = r.stdout.strip()

    def _up(self, nodes: int, want: set[int]) -> None:
        if self.root:
            if not Path(self.root).exists():
                self.root_created = True
            Path(self.root).mkdir(parents=True, exist_ok=True)
        else:
            self.root = tempfile.mkdtemp(prefix=f"toolcage-lc-{self.id}-", dir="/var/tmp")
            self.root_created = True
        for d in (self.run_dir, self.ray_dir):
            os.makedirs(d, mode=0o700)
        self._save()
        log(f"cluster {self.id}: state in {self.root}")
        self._host_network()
        self.storage_driver = self._pick_storage_driver()
        self.runtimes = self._runtimes()
        self._ensure_ray_token()
        self.port = _free_port()

        errors: list[BaseException] = []

        def guarded(fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    fn()
                except BaseException as exc:
                    errors.append(exc)

            return run

        head = threading.Thread(target=guarded(self._start_head), name="lc-head")
        head.start()
        for k in range(nodes):
            self._new_node(k, k in want)
        self._save()
        engines = threading.Thread(target=guarded(self._engines_up), name="lc-engines")
        engines.start()
        head.join()
        if not errors:
            # workers join while the engines come up: a worker's raylet needs only its engine's socket path
            try:
                for n in self.nodes:
                    self._start_node_ray(n)
                for n in self.nodes:
                    self._wait_started(n)
            except BaseException as exc:
                errors.append(exc)
        engines.join()
        if errors:
            raise errors[0]
        for n in self.nodes:
            n.node_id = self._wait_node_id(n.name, exclude=set())

    def _host_network(self) -> None:
        r = _run(["ip", "-j", "route", "show", "default"], check=False)
        routes = json.loads(r.stdout or "[]") if r.returncode == 0 else []
        self.uplink = routes[0].get("dev") if routes else None
        if self.uplink:
            try:
                self.mtu = int(Path(f"/sys/class/net/{self.uplink}/mtu").read_text())
            except (OSError, ValueError):
                self.mtu = 1500
            if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
                log("host ip_forward was 0: setting it to 1 (the nodes' containers reach out through the host)")
                Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        else:
            log("no default route: the nodes' containers get no way out")

    def _pick_storage_driver(self) -> str:
        """overlay2 when the kernel's overlayfs mounts in the root's filesystem, else fuse-overlayfs, else vfs."""
        probe = Path(self.root) / ".overlay-probe"
        dirs = [probe / x for x in ("l", "u", "w", "m")]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        r = _run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={dirs[0]},upperdir={dirs[1]},workdir={dirs[2]}",
                str(dirs[3]),
            ],
            check=False,
        )
        if r.returncode == 0:
            _run(["umount", str(dirs[3])], check=False)
        shutil.rmtree(probe, ignore_errors=True)
        if r.returncode == 0:
            return "overlay2"
        driver = "fuse-overlayfs" if shutil.which("fuse-overlayfs") else "vfs"
        log(f"overlayfs does not mount under {self.root} ({r.stderr.strip()}): the engines use {driver}")
        return driver

    def _runtimes(self) -> dict[str, Any]:
        """gVisor, registered as .ci/register-runsc registers it with the main engine, when runsc is installed."""
        runsc = shutil.which("runsc")
        if not runsc:
            return {}
        return {"runsc": {"path": runsc, "runtimeArgs": RUNSC_ARGS}}

    def _ensure_ray_token(self) -> None:
        """Nodes and drivers use Ray's own token lookup; make ~/.ray/auth_token if there is none (as ray start
        --head does), and point this process's Ray client at token mode (restored by down())."""
        self._env_saved.setdefault("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE"))
        os.environ["RAY_AUTH_MODE"] = "token"
        from ray._private.authentication import authentication_token_setup as ats
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        loader = AuthenticationTokenLoader.instance()
        loader.reset_cache()
        if not loader.has_token(ignore_auth_mode=True):
            ats.generate_and_save_token()
            loader.reset_cache()
            log("made a Ray auth token in ~/.ray/auth_token (Ray's default place; drivers find it there)")

    def _ray_bin(self) -> Path:
        return Path(sys.executable).with_name("ray")

    def _ray_env(self, role: str) -> dict[str, str]:
        drop = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "RAY_ADDRESS")
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("RAY_health_check")}
        env.update({"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0", MARKER: f"{self.id}/{role}/"})
        return env

    def _spawn(self, cmd: list[str], env: dict[str, str], logfile: str) -> Proc:
        with open(logfile, "ab") as out:
            p = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._popen[p.pid] = p
        return Proc.of(p.pid)

    def _ray_common(self, temp_dir: str) -> list[str]:
        return [
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp_dir}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            "--disable-usage-stats",
        ]

    def _start_head(self) -> None:
        logfile = os.path.join(self.root, "head-ray.log")
        cmd = [str(self._ray_bin()), "start", "--head", f"--port={self.port}", "--num-cpus=0", "--resources={}"]
        cmd += ["--node-name=toolcage-head", "--include-dashboard=false", f"--dashboard-port={_free_port()}"]
        cmd += self._ray_common(os.path.join(self.ray_dir, "head"))
        env = self._ray_env("head") | self.health_check
        t = time.monotonic()
        with self._lock:
            self.head = self._spawn(cmd, env, logfile)
            self._save()
        self._wait_ray_log(self.head, logfile, "the head")
        log(f"head up on {self.address} ({time.monotonic() - t:.1f}s)")

    def _start_node_ray(self, n: Node) -> None:
        res = json.dumps({ENGINE_RESOURCE: 1})
        cmd = [str(self._ray_bin()), "start", f"--address={self.address}", f"--num-cpus={self.cpus}"]
        cmd += [f"--resources={res}", f"--node-name={n.name}"]
        cmd += self._ray_common(os.path.join(self.ray_dir, f"n{n.index}.{n.gen}"))
        if not self.log_monitor:
            cmd.append("--include-log-monitor=false")
        env = self._ray_env(f"node{n.index}") | {
            "DOCKER_HOST": n.docker_host,
            "TOOLCAGE_AUDIT_LOG": n.audit_log,
            "XDG_STATE_HOME": n.state_home,
        }
        with self._lock:
            n.ray = self._spawn(cmd, env, n.ray_log)
            self._save()

    def _wait_started(self, n: Node) -> None:
        t = time.monotonic()
        assert n.ray is not None
        self._wait_ray_log(n.ray, n.ray_log, n.name)
        log(f"{n.name}: ray node started ({time.monotonic() - t:.1f}s after asked)")

    def _wait_ray_log(self, proc: Proc, logfile: str, what: str, timeout: float = 120.0) -> None:
        """ray start --block writes "Ray runtime started." once the node is registered; then it stays."""
        end = time.monotonic() + timeout
        seen = 0
        while True:
            try:
                with open(logfile, "rb") as f:
                    f.seek(seen)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if b"Ray runtime started" in chunk:
                return
            seen += max(0, len(chunk) - 64)
            if not proc.alive():
                self._reap(proc.pid)
                raise ClusterError(
                    f"ray start for {what} exited during start-up; the end of its log"
                    f" ({logfile}, removed with the cluster):\n{_tail(logfile)}"
                )
            if time.monotonic() > end:
                raise ClusterError(
                    f"ray start for {what} not up after {timeout}s; the end of {logfile}:\n{_tail(logfile)}"
                )
            time.sleep(0.1)

    def _gcs_client(self) -> Any:
        if self._gcs is None:
            from ray._raylet import GcsClient  # type: ignore[attr-defined]

            self._gcs = GcsClient(address=self.address)
        return self._gcs

    def _node_infos(self) -> dict[str, dict[str, Any]]:
        infos = self._gcs_client().get_all_node_info(timeout=10)
        out = {}
        for nid, i in infos.items():
            key = nid.hex() if hasattr(nid, "hex") else str(nid)
            out[key] = {"name": i.node_name, "alive": i.state == 0, "resources": dict(i.resources_total)}
        return out

    def nodes_info(self) -> dict[str, dict[str, Any]]:
        """Every Ray node the GCS knows (dead ones too): node id -> name, alive, resources."""
        return self._node_infos()

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every job (driver) the GCS knows: job id -> is_dead, driver_pid. Needs no dashboard and no driver;
        a SIGKILLed driver's job is dead within ~0.1 s (its raylet sees the connection go)."""
        out = {}
        for jid, j in self._gcs_client().get_all_job_info(timeout=10).items():
            key = jid.hex() if hasattr(jid, "hex") else str(jid)
            out[key] = {"is_dead": bool(j.is_dead), "driver_pid": int(j.driver_pid)}
        return out

    def _wait_node_id(self, name: str, exclude: set[str], timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while True:
            for nid, i in self._node_infos().items():
                if i["name"] == name and i["alive"] and nid not in exclude:
                    return nid
            if time.monotonic() > end:
                raise ClusterError(f"no live Ray node named {name} after {timeout}s")
            time.sleep(0.1)

    # -- engines

    def _new_node(self, k: int, image: bool) -> Node:
        with self._lock:
            slot = self._claim_slot()
            ndir = os.path.join(self.root, f"node{k}")
            exec_root = os.path.join(self.run_dir, f"n{k}")
            n = Node(k, slot, ndir, os.path.join(exec_root, "docker.sock"), exec_root, image)
            self.nodes.append(n)
            self._save()
        os.makedirs(n.state_home, exist_ok=True)
        os.makedirs(n.data_root, exist_ok=True)
        os.makedirs(exec_root, exist_ok=True)
        Path(n.audit_log).touch()
        self._node_network(n)
        conf: dict[str, Any] = {
            "storage-driver": self.storage_driver,
            "mtu": self.mtu,
            "log-driver": "json-file",
            "log-opts": {"max-size": "10m", "max-file": "3"},
            "shutdown-timeout": 5,
        }
        if self.runtimes:
            conf["runtimes"] = self.runtimes
        Path(n.dir, "daemon.json").write_text(json.dumps(conf, indent=2) + "\n")
        return n

    def _claim_slot(self) -> int:
        """A free slot S: the namespace tclcS made here (ip netns add refuses a name that exists, so two
        clusters never get the same), and 10.(200+S).0.0/16 overlapping no route of the host."""
        taken = {n.slot for n in self.nodes}
        routes = _run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout or "[]"
        nets = []
        for r in json.loads(routes):
            dst = r.get("dst", "")
            if dst and dst != "default":
                try:
                    nets.append(ipaddress.ip_network(dst, strict=False))
                except ValueError:
                    pass
        for s in SLOTS:
            mine = ipaddress.ip_network(f"10.{200 + s}.0.0/16")
            if s in taken or any(mine.overlaps(x) for x in nets):
                continue
            if _run(["ip", "netns", "add", f"tclc{s}"], check=False).returncode == 0:
                return s
        raise ClusterError("no free network slot: tclc0..tclc49 all exist (ip netns list; stale ones: ip netns del)")

    def _node_network(self, n: Node) -> None:
        b, ns = n.net16, n.netns
        _run(["ip", "link", "add", n.veth, "mtu", str(self.mtu), "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "addr", "add", f"{b}.255.253/30", "dev", n.veth])
        _run(["ip", "link", "set", n.veth, "up"])
        batch = "\n".join(
            [
                "link set lo up",
                f"addr add {b}.255.254/30 dev eth0",
                "link set eth0 up",
                f"route add default via {b}.255.253",
                f"link add {n.bridge} mtu {self.mtu} type bridge",
                f"addr add {b}.254.1/24 dev {n.bridge}",
                f"link set {n.bridge} up",
            ]
        )
        _run(["ip", "-n", ns, "-batch", "-"], input=batch)
        if self.uplink:
            for rule in (
                ["filter", "FORWARD", "-i", n.veth, "-o", self.uplink],
                [
                    "filter",
                    "FORWARD",
                    "-i",
                    self.uplink,
                    "-o",
                    n.veth,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                ],
                ["nat", "POSTROUTING", "-s", f"{b}.255.252/30", "-o", self.uplink],
            ):
                rule += ["-m", "comment", "--comment", self.tag, "-j", "MASQUERADE" if rule[0] == "nat" else "ACCEPT"]
                _run(["iptables", "-w", "-t", rule[0], "-A", *rule[1:]])
                with self._lock:
                    self.rules.append(rule)
                    self._save()

    def _engines_up(self) -> None:
        image_nodes = [n for n in self.nodes if n.has_image]
        rest = [n for n in self.nodes if not n.has_image]
        if self.image_mode == "load":
            tar = self._save_image() if image_nodes else None
            for n in self.nodes:
                self._start_dockerd(n)
            for n in self.nodes:
                self._wait_engine(n)
            _parallel([functools.partial(self._load_tar, n, tar) for n in image_nodes])
            return
        if image_nodes:
            self._use_cache()
        seed, clones = (image_nodes[0], image_nodes[1:]) if image_nodes and self._tpl is None else (None, image_nodes)
        for n in ([seed] if seed else []) + rest:
            self._start_dockerd(n)
        if seed:
            self._wait_engine(seed)
            self._seed(seed)
        for n in clones:
            self._clone_image(n)
            self._start_dockerd(n)
        for n in rest + clones:
            self._wait_engine(n)
        for n in clones:
            self._check_image(n)
        if seed:
            self._fill_cache()

    def _engine_up(self, n: Node) -> None:
        """One node's engine (add_node): from the template when there is one, else as the seed."""
        if n.has_image and self.image_mode == "clone":
            self._use_cache()
            if self._tpl is not None:
                self._clone_image(n)
                self._start_dockerd(n)
                self._wait_engine(n)
                self._check_image(n)
                return
            self._start_dockerd(n)
            self._wait_engine(n)
            self._seed(n)
            self._fill_cache()
            return
        self._start_dockerd(n)
        self._wait_engine(n)
        if n.has_image:
            self._load_tar(n, self._save_image())

    def _seed(self, n: Node) -> None:
        self._stream_image(n)
        self._make_template(n)

    def _cache_entry(self) -> Path | None:
        """Where the image's template lives in image_cache: one per image id, storage driver and dockerd."""
        if not self.image_cache or not self.image_id:
            return None
        version = _run(["dockerd", "--version"]).stdout.strip()
        key = hashlib.sha256(f"{self.image_id}|{self.storage_driver}|{version}".encode()).hexdigest()[:16]
        return Path(self.image_cache) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.image)}-{key}"

    def _use_cache(self) -> None:
        entry = self._cache_entry()
        if self._tpl is None and entry is not None and (entry / "complete").exists():
            self._tpl = entry
            log(f"image template from the cache: {entry}")

    def _fill_cache(self) -> None:
        """Put the template into image_cache (hard links when it is on the same filesystem), atomically."""
        entry = self._cache_entry()
        if entry is None or self._tpl is None or (entry / "complete").exists():
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.parent / f".{entry.name}.{self.id}"
        try:
            tmp.mkdir()
            for part in (self.storage_driver, "image"):
                src, dst = str(self._tpl / part), str(tmp / part)
                if _run(["cp", "-al", src, dst], check=False).returncode != 0:  # another filesystem
                    shutil.rmtree(dst, ignore_errors=True)
                    _run(["cp", "-a", src, dst])
            (tmp / "complete").write_text(json.dumps({"image": self.image, "id": self.image_id}) + "\n")
            os.rename(tmp, entry)
            log(f"image template cached in {entry}")
        except (OSError, ClusterError) as exc:  # another cluster filled it first, or no room: only a speed-up
            log(f"image cache not filled ({exc})")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _start_dockerd(self, n: Node) -> None:
        os.makedirs(n.exec_root, exist_ok=True)
        cmd = ["nsenter", f"--net=/run/netns/{n.netns}", "dockerd"]
        cmd += ["--config-file", os.path.join(n.dir, "daemon.json"), "--data-root", n.data_root]
        cmd += ["--exec-root", os.path.join(n.exec_root, "exec"), "--pidfile", os.path.join(n.exec_root, "dockerd.pid")]
        cmd += ["-H", n.docker_host, f"--bridge={n.bridge}"]
        cmd += ["--default-address-pool", f"base={n.net16}.0.0/17,size=24"]
        env = _docker_env() | {MARKER: f"{self.id}/engine{n.index}/"}
        with self._lock:
            n.dockerd = self._spawn(cmd, env, os.path.join(n.dir, "dockerd.log"))
            self._save()
        n.engine_t0 = time.monotonic()

    def _wait_engine(self, n: Node, timeout: float = 60.0) -> None:
        assert n.dockerd is not None
        logfile = os.path.join(n.dir, "dockerd.log")
        end = time.monotonic() + timeout
        while not _ping(n.socket):
            if not n.dockerd.alive():
                rc = self._reap(n.dockerd.pid)
                raise ClusterError(
                    f"dockerd of {n.name} exited (code {rc}) during start-up; the end of its log"
                    f" ({logfile}, removed with the cluster):\n{_tail(logfile)}"
                )
            if time.monotonic() > end:
                raise ClusterError(
                    f"dockerd of {n.name} not answering after {timeout}s; the end of {logfile}:\n{_tail(logfile)}"
                )
            time.sleep(0.05)
        took = time.monotonic() - n.engine_t0
        log(f"{n.name}: engine up ({took:.1f}s), {n.docker_host}, namespace {n.netns}, pool {n.net16}.0.0/17")

    def _stream_image(self, n: Node) -> None:
        t = time.monotonic()
        save = subprocess.Popen(["docker", "save", self.image], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert save.stdout is not None
        load = subprocess.run(
            ["docker", "-H", n.docker_host, "load", "-q"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            env=_docker_env(),
        )
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise ClusterError(f"docker save {self.image} | docker load into {n.name} failed: {load.stderr.strip()}")
        self._check_image(n)
        log(f"{n.name}: image streamed in ({time.monotonic() - t:.1f}s)")

    def _check_image(self, n: Node) -> None:
        r = n.docker("image", "inspect", "--format", "{{.Id}}", self.image, check=False)
        if r.returncode != 0 or r.stdout.strip() != self.image_id:
            raise ClusterError(f"{n.name}'s engine does not have {self.image} ({self.image_id}): {r.stderr.strip()}")

    def _make_template(self, seed: Node) -> None:
        """Hard links of the seed's storage dir and a copy of its image store, taken before anything runs
        on it (nothing but the image's layers is there yet). dockerd bind-mounts its storage dir onto itself,
        and no hard link crosses a mount: the links are made through a plain bind mount of the root, which
        shows the directory under that mount."""
        tpl = Path(self.root, "template")
        tpl.mkdir()
        view = os.path.join(self.run_dir, "rootview")
        os.makedirs(view, exist_ok=True)
        _run(["mount", "--bind", self.root, view])
        try:
            rel = os.path.relpath(os.path.join(seed.data_root, self.storage_driver), self.root)
            _run(["cp", "-al", os.path.join(view, rel), os.path.join(view, "template", self.storage_driver)])
        finally:
            _run(["umount", view], check=False)
            os.rmdir(view)
        _run(["cp", "-a", os.path.join(seed.data_root, "image"), str(tpl / "image")])
        self._tpl = tpl

    def _clone_image(self, n: Node) -> None:
        t = time.monotonic()
        tpl = self._tpl
        assert tpl is not None
        for part, flag in ((self.storage_driver, "-al"), ("image", "-a")):
            dst = os.path.join(n.data_root, part)
            shutil.rmtree(dst, ignore_errors=True)
            r = _run(["cp", flag, str(tpl / part), dst], check=False)
            if r.returncode != 0 and flag == "-al":  # another filesystem: a real copy
                shutil.rmtree(dst, ignore_errors=True)
                _run(["cp", "-a", str(tpl / part), dst])
            elif r.returncode != 0:
                raise ClusterError(f"copying the image into {n.name}: {r.stderr.strip()}")
        log(f"{n.name}: image cloned into its data root ({time.monotonic() - t:.1f}s)")

    def _save_image(self) -> str:
        t = time.monotonic()
        tar = os.path.join(self.root, "image.tar")
        _run(["docker", "save", "-o", tar, self.image])
        log(f"docker save {self.image} ({time.monotonic() - t:.1f}s)")
        return tar

    def _load_tar(self, n: Node, tar: str | None) -> None:
        t = time.monotonic()
        assert tar is not None
        n.docker("load", "-q", "-i", tar, timeout=600)
        self._check_image(n)
        log(f"{n.name}: image loaded ({time.monotonic() - t:.1f}s)")

    # -- teardown

    def _reap(self, pid: int) -> int | None:
        p = self._popen.pop(pid, None)
        if p is None:
            return None
        try:
            return p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _stop_group(self, proc: Proc, what: str, grace: float = 0.0) -> None:
        """End the process group we started (its leader is proc; Ray's own children stay in it; Ray's
        workers, in groups of their own, go by the marker sweep in down()): SIGTERM first when grace > 0,
        then SIGKILL. A group whose leader is gone is touched only where its members carry our marker."""
        if proc.alive() and grace > 0:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_gone(proc.alive, grace):
                log(f"{what} (pid {proc.pid}) still up {grace}s after SIGTERM: SIGKILL")
        if proc.alive():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _signal([p for p in marked(self.id) if (st := _stat(p)) and st[1] == proc.pid], signal.SIGKILL)
        _wait_gone(proc.alive, 5)
        self._reap(proc.pid)

    def _stop_dockerds(self, nodes: list[Node], timeout: float) -> None:
        live = [n for n in nodes if n.dockerd is not None and n.dockerd.alive()]
        for n in live:
            assert n.dockerd is not None
            _signal([n.dockerd.pid], signal.SIGTERM)
        end = time.monotonic() + timeout
        for n in live:
            assert n.dockerd is not None
            if not _wait_gone(n.dockerd.alive, max(0.0, end - time.monotonic())):
                log(f"dockerd of {n.name} still up {timeout}s after SIGTERM: SIGKILL")
                _signal([n.dockerd.pid], signal.SIGKILL)
                _wait_gone(n.dockerd.alive, 5)
            self._reap(n.dockerd.pid)
            log(f"{n.name}: engine stopped")
        for n in nodes:
            # its containerd stops with it; what is left of ours (a SIGKILLed dockerd's containerd, shims) goes
            left = marked(self.id, f"engine{n.index}/")
            if left:
                log(f"{n.name}: killing {len(left)} engine processes left behind: {left}")
                _signal(left, signal.SIGKILL)

    def down(self) -> None:
        """Tear everything down (idempotent): Ray nodes, engines, mounts, rules, veths, namespaces, dirs."""
        if self._down:
            return
        self._down = True
        problems: list[str] = []

        def step(what: str, fn: Callable[[], None]) -> None:
            try:
                fn()
            except Exception as exc:
                problems.append(f"{what}: {exc}")
                log(f"teardown: {what}: {exc}")

        self._gcs = None
        log(f"cluster {self.id}: tearing down")
        for n in self.nodes:
            if n.ray is not None:
                step(f"{n.name} ray", functools.partial(self._stop_group, n.ray, f"{n.name}'s ray start"))
        if self.head is not None:
            step("head ray", functools.partial(self._stop_group, self.head, "the head's ray start"))

        def sweep_ray() -> None:
            for _ in range(50):
                left = [p for r in ("head/", "node") for p in marked(self.id, r)]
                if not left:
                    return
                _signal(left, signal.SIGKILL)
                time.sleep(0.1)
            raise ClusterError(f"Ray processes survive SIGKILL: {left}")

        step("ray processes", sweep_ray)
        step("engines", lambda: self._stop_dockerds(self.nodes, 20.0))
        step("mounts", self._umount_ours)
        for rule in list(self.rules):
            step(f"iptables {rule}", functools.partial(self._del_rule, rule))
        for n in self.nodes:
            step(f"{n.name} network", functools.partial(self._del_node_network, n))
        step("directories", self._remove_dirs)
        for k, v in self._env_saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if problems:
            raise ClusterError("teardown left problems:\n" + "\n".join(problems))
        log(f"cluster {self.id}: down")

    def _umount_ours(self) -> None:
        roots = [p for p in (self.root, self.run_dir, self.ray_dir) if p]
        mine = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if any(mp == r or mp.startswith(r.rstrip("/") + "/") for r in roots):
                mine.append(mp)
        for mp in sorted(set(mine), key=len, reverse=True):
            _run(["umount", "-l", mp], check=False)
        if mine:
            log(f"unmounted {len(set(mine))} mounts left under our directories")

    def _del_rule(self, rule: list[str]) -> None:
        r = _run(["iptables", "-w", "-t", rule[0], "-D", *rule[1:]], check=False)
        if r.returncode != 0 and "does a matching rule exist" not in r.stderr and "Bad rule" not in r.stderr:
            raise ClusterError(r.stderr.strip())
        self.rules.remove(rule)

    def _del_node_network(self, n: Node) -> None:
        if Path(f"/sys/class/net/{n.veth}").exists():
            _run(["ip", "link", "del", n.veth])
        if Path(f"/run/netns/{n.netns}").exists():
            _run(["ip", "netns", "del", n.netns])

    def _remove_dirs(self) -> None:
        for d in (self.run_dir, self.ray_dir):
            shutil.rmtree(d, ignore_errors=True)
        if not self.root:
            return
        root = Path(self.root)
        for n in self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)
        for name in ("template", "image.tar", "head-ray.log", ".overlay-probe", STATE_FILE):
            p = root / name
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if self.root_created:
            try:
                root.rmdir()
            except OSError as exc:
                log(f"left {root}: {exc}")
        left = [d for d in (self.run_dir, self.ray_dir, *(n.dir for n in self.nodes)) if os.path.exists(d)]
        if left:
            raise ClusterError(f"could not remove {left}")

    # -- state

    def _save(self) -> None:
        if not self.root or self._down or not os.path.isdir(self.root):
            return
        with self._lock:
            path = Path(self.root) / STATE_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
            os.replace(tmp, path)

    def _need_up(self) -> None:
        if not self._is_up or self._down:
            raise ClusterError("the cluster is not up")


def _parallel(fns: list[Callable[[], None]]) -> None:
    """Run each in a thread of its own; raise the first error once all are done."""
    errs: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            errs.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]


# ---------------------------------------------------------------- CLI


def _index_set(text: str) -> set[int]:
    return {int(x) for x in text.split(",") if x.strip()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring a cluster up, print its JSON, leave it running")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--state", required=True, help="the cluster's directory (state, node dirs, data roots)")
    up.add_argument("--image", default=DEFAULT_IMAGE)
    up.add_argument("--image-on", type=_index_set, default=None, help="comma-separated node indexes (default: all)")
    up.add_argument("--image-mode", choices=("clone", "load"), default="clone")
    up.add_argument("--image-cache", help="a directory that keeps the image's template between clusters")
    up.add_argument("--log-monitor", action="store_true", help="forward the worker nodes' task output to drivers")
    up.add_argument("--cpus", type=int, default=NODE_CPUS)
    up.add_argument("--object-store-mb", type=int, default=256)
    down = sub.add_parser("down", help="tear down the cluster in --state")
    down.add_argument("--state", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            c = LocalCluster(
                args.state,
                image=args.image,
                cpus=args.cpus,
                object_store_mb=args.object_store_mb,
                image_mode=args.image_mode,
                image_cache=args.image_cache,
                log_monitor=args.log_monitor,
            )
            c.up(nodes=args.nodes, image_on=args.image_on)
            print(json.dumps(c.to_json(), indent=2))
        else:
            LocalCluster.from_state(args.state).down()
    except ClusterError as exc:
        print(f"local_cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
