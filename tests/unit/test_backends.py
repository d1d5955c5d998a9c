"""The backend seam: Sandbox runs on any Backend and never asks which one it has."""

from __future__ import annotations

import ast
import inspect
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox, backends
from toolcage import sandbox as sandbox_mod
from toolcage.backends import ExitStatus
from toolcage.backends.process import ProcessBackend
from toolcage.engine.knobs import GVISOR, RUNC


class RecordingBackend(ProcessBackend):
    """The local worker, recording which of the five seam methods the Sandbox used."""

    def __init__(self, policy: Any, options: Any) -> None:
        super().__init__(policy, options)
        self.seen: list[str] = []

    def image_id(self) -> str | None:
        self.seen.append("image_id")
        return "sha256:fake"

    def start(self, run: Any, parser: Any) -> Any:
        self.seen.append("start")
        return super().start(run, parser)

    def kill(self) -> None:
        self.seen.append("kill")
        super().kill()

    def exit_status(self, timeout: float) -> ExitStatus:
        self.seen.append("exit_status")
        return super().exit_status(timeout)

    def remove(self, keep: bool) -> None:
        self.seen.append("remove")
        super().remove(keep)


def test_a_new_backend_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend registered by name runs a whole run (start, calls, usage, remove) with no change to Sandbox."""
    monkeypatch.setitem(backends.BACKENDS, "recording", RecordingBackend)
    with Sandbox(sandbox="recording", audit=False) as sb:
        assert sb.call("ping").result == "pong"
        backend = sb._run.backend
    assert isinstance(backend, RecordingBackend)
    assert backend.seen[0] == "start" and "remove" in backend.seen and "kill" not in backend.seen
    assert sb.summary is not None and sb.summary.status == "ok" and sb.summary.calls == 1


def test_unknown_backend_is_a_usage_error() -> None:
    """--sandbox with a name no backend has is refused before anything starts, listing the names."""
    from toolcage import UsageError

    with pytest.raises(UsageError, match="'container', 'gvisor', 'none', 'auto'"):
        Sandbox(sandbox="firecracker", audit=False)


ROOT = Path(__file__).resolve().parents[2]
KINDS_HOME = "runner/backends/__init__.py"  # the registry: the one module that may compare a kind with its name
# Allowed, each with why:
KIND_COMPARISONS_ALLOWED = {
    "runner/lifecycle/reaper.py": "an engine object's kind (container, volume), not a backend's",
    "runner/ops/doctor.py": "the operator's view reports per backend kind",
    "runner/ops/probes.py": "the operator's view reports per backend kind",
}


def kind_comparisons(tree: ast.AST, kinds: set[str]) -> list[int]:
    """Lines where ``kind`` (a name or an attribute) is compared with a backend's name, with any operator."""

    def is_kind(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "kind") or (
            isinstance(node, ast.Attribute) and node.attr == "kind"
        )

    def names(node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(*(names(e) for e in node.elts)) if node.elts else set()
        return set()

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_kind(o) for o in operands) and any(names(o) & kinds for o in operands):
                lines.append(node.lineno)
    return lines


def test_no_code_branches_on_a_backend_kind() -> None:
    """Outside the kinds module, no code compares a kind with a backend's name (==, !=, in: all of them)."""
    kinds = {*backends.BACKENDS, "auto"}
    bad = []
    for path in sorted((ROOT / "runner").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == KINDS_HOME or rel in KIND_COMPARISONS_ALLOWED:
            continue
        bad += [f"{rel}:{line}" for line in kind_comparisons(ast.parse(path.read_text()), kinds)]
    assert not bad, bad


def test_the_kind_check_sees_every_operator() -> None:
    """The check itself: `!=` and `in` are found as well as `==` (the old grep for `kind ==` missed `!=`)."""
    sample = 'a = self.kind != "none"\nb = kind == "gvisor"\nc = o.kind in ("container", "x")\nd = kind == "other"\n'
    assert kind_comparisons(ast.parse(sample), {"none", "gvisor", "container"}) == [1, 2, 3]


def test_sandbox_does_not_branch_on_its_transport() -> None:
    """No transport isinstance checks remain in the Sandbox (issue 8)."""
    source = inspect.getsource(sandbox_mod)
    assert "isinstance(self._transport" not in source
    assert "ProcessTransport" not in source and "DockerAttachTransport" not in source
    assert sys.modules["toolcage.sandbox"] is sandbox_mod


class _Info:
    def __init__(self, runtimes: dict[str, Any]) -> None:
        self.runtimes = runtimes

    def info(self) -> dict[str, Any]:
        return {"Runtimes": self.runtimes}


def test_auto_takes_the_strongest_kind_the_engine_has_and_isolation_is_a_minimum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """auto: gvisor when the engine has runsc registered, else container (never none); a policy's
    isolation refuses a weaker kind with the fix in the message."""
    from toolcage import UsageError
    from toolcage.backends import resolve_kind
    from toolcage.policies import Policy

    plain, strict = Policy(), Policy(name="strict", isolation="gvisor")
    args = ["--network=none", "--oci-seccomp", "--overlay2=none"]
    with_runsc, without = _Info({"runc": {}, "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": args}}), _Info({})
    assert resolve_kind("auto", plain, with_runsc) == "gvisor"  # type: ignore[arg-type]
    assert resolve_kind("auto", plain, without) == "container"  # type: ignore[arg-type]
    assert resolve_kind("none", plain) == "none" and resolve_kind("container", plain) == "container"
    assert resolve_kind("auto", strict, with_runsc) == "gvisor"  # type: ignore[arg-type]
    for kind, engine in (("container", None), ("none", None), ("auto", without)):
        with pytest.raises(UsageError, match=r"requires isolation 'gvisor'.*runsc"):
            resolve_kind(kind, strict, engine)  # type: ignore[arg-type]


def test_a_runsc_without_the_flags_the_kind_needs_is_not_gvisor() -> None:
    """Podman lists a runsc found on the PATH with no runtimeArgs: without --oci-seccomp toolcage's profile
    would not apply inside gVisor. auto passes it over; --sandbox gvisor is refused naming the flag; doctor
    says why it is not usable."""
    from toolcage import UsageError
    from toolcage.backends import resolve_kind
    from toolcage.ops.engines import backends_report
    from toolcage.policies import Policy

    bare = _Info({"runc": {}, "runsc": {"path": "/usr/bin/runsc"}})
    no_overlay = _Info({"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--oci-seccomp"]}})
    assert resolve_kind("auto", Policy(), bare) == "container"  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"without --oci-seccomp and --overlay2=none.*register-runsc"):
        resolve_kind("gvisor", Policy(), bare)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"without --overlay2=none \(its runtimeArgs: --oci-seccomp\)"):
        resolve_kind("gvisor", Policy(), no_overlay)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"no runsc runtime registered"):
        resolve_kind("gvisor", Policy(), _Info({"runc": {}}))  # type: ignore[arg-type]
    report = backends_report({}, bare.info())
    assert report["auto"] == "container" and not report["kinds"]["gvisor"]["available"]
    assert "not usable" in report["kinds"]["gvisor"]["note"]


def test_gvisor_runtime_in_the_container_config() -> None:
    """Under runsc the sandbox and its egress proxy name the runtime; the process limit moves to
    RLIMIT_NPROC (enforced per user inside gVisor) and the cgroup's pids limit is the sentry's backstop."""
    from tests.unit._helpers import run_spec
    from toolcage.engine.hostconfig import container_config, proxy_container_config
    from toolcage.policies import load_policy

    policy = load_policy("connector-http")
    plain = container_config(policy, run_spec())["HostConfig"]
    assert "Runtime" not in plain and plain["PidsLimit"] == policy.limits.pids
    assert [u["Name"] for u in plain["Ulimits"]] == ["nofile"]
    spec = run_spec(proxy_volume="toolcage-sock-x", runtime=GVISOR, proxy_runtime=GVISOR)
    for hc, pids in ((container_config(policy, spec)["HostConfig"], policy.limits.pids),
                     (proxy_container_config(policy, spec, "net", None)["HostConfig"], 32)):  # fmt: skip
        assert hc["Runtime"] == "runsc" and hc["PidsLimit"] > 8 * pids
        assert {"Name": "nproc", "Soft": pids, "Hard": pids} in hc["Ulimits"]
        assert hc["Tmpfs"]["/tmp"].startswith("ro,")  # not runsc's own writable /tmp
    assert "/tmp" not in plain["Tmpfs"]


def test_gvisor_without_a_network_stack_runs_the_egress_proxy_under_runc() -> None:
    """runsc registered with --network=none cannot give the egress proxy its network: the proxy then
    runs under the engine's default runtime (doctor says so), the sandbox still under runsc."""
    from tests.unit._helpers import run_spec
    from toolcage.backends.gvisor import gvisor_networked
    from toolcage.engine.hostconfig import container_config, proxy_container_config
    from toolcage.ops.engines import backends_report
    from toolcage.policies import load_policy

    none = {"Runtimes": {"runc": {}, "runsc": {"runtimeArgs": ["--network=none", "--platform=ptrace"]}}}
    netted = {"Runtimes": {"runc": {}, "runsc": {"runtimeArgs": ["--platform=ptrace"]}}}
    assert not gvisor_networked(none) and gvisor_networked(netted) and not gvisor_networked({"Runtimes": {}})
    assert backends_report({}, none)["kinds"]["gvisor"]["egress_proxy_runtime"] == "runc"
    policy = load_policy("connector-http")
    spec = run_spec(proxy_volume="toolcage-sock-x", runtime=GVISOR, proxy_runtime=RUNC)
    assert container_config(policy, spec)["HostConfig"]["Runtime"] == "runsc"
    proxy = proxy_container_config(policy, spec, "net", None)["HostConfig"]
    assert "Runtime" not in proxy and proxy["PidsLimit"] == 32 and proxy["CapDrop"] == ["ALL"]


def test_runc_versions_with_known_escapes_are_named_with_their_fix() -> None:
    """doctor's warnings: runc older than 1.1.12 (CVE-2024-21626) and than 1.2.8 (the 2025 masked-path races)."""
    from toolcage.ops.engines import backends_report, runc_warnings

    assert len(runc_warnings("1.1.5+ds1")) == 2 and "1.1.12" in runc_warnings("1.1.5")[0]
    assert ["1.2.8" in w for w in runc_warnings("1.1.12")] == [True]
    assert runc_warnings("1.2.8") == runc_warnings("1.3.3") == runc_warnings(None) == []
    report = backends_report(
        {"Components": [{"Name": "runc", "Version": "1.1.5+ds1"}]}, {"Runtimes": {"runc": {}}, "DefaultRuntime": "runc"}
    )
    assert report["auto"] == "container" and not report["kinds"]["gvisor"]["available"]
    assert report["kinds"]["container"]["version"] == "1.1.5+ds1" and len(report["warnings"]) == 2


def test_podman_knobs_applied_once_to_the_sandbox_and_its_proxy() -> None:
    """Podman's compat API: seccomp by the shipped file's path, tmpfs owned through U (once each), an
    explicit nproc."""
    from tests.unit._helpers import run_spec
    from toolcage.engine.hostconfig import container_config, proxy_container_config
    from toolcage.engine.knobs import PODMAN, PODMAN_NPROC, READONLY_TMPFS
    from toolcage.engine.seccomp import SHIPPED
    from toolcage.policies import load_policy

    policy = load_policy("connector-http")
    spec = run_spec(proxy_volume="toolcage-sock-x", flavor=PODMAN)
    for hc in (
        container_config(policy, spec)["HostConfig"],
        proxy_container_config(policy, spec, "n", None)["HostConfig"],
    ):
        assert f"seccomp={SHIPPED}" in hc["SecurityOpt"]
        assert hc["Tmpfs"]["/tmp"] == hc["Tmpfs"]["/var/tmp"] == READONLY_TMPFS  # not Podman's writable ones
        for target, opts in hc["Tmpfs"].items():
            if target not in ("/tmp", "/var/tmp"):
                assert opts.split(",").count("U") == 1 and "uid=" not in opts, opts
        assert [u for u in hc["Ulimits"] if u["Name"] == "nproc"] == [
            {"Name": "nproc", "Soft": PODMAN_NPROC, "Hard": PODMAN_NPROC}
        ]


def test_doctor_lists_every_engine_with_its_mode_and_kinds() -> None:
    """DOCKER_HOST's engine first, then rootful and rootless Docker and Podman sockets; each summarised as
    docker or podman, rootless or rootful (userns-remap), and the kinds it can serve."""
    from toolcage.ops.engines import engine_sockets, engine_summary

    socks = engine_sockets({"DOCKER_HOST": "unix:///run/podman/podman.sock", "XDG_RUNTIME_DIR": "/run/user/1000"}, 1000)
    assert socks == [
        "unix:///run/podman/podman.sock",
        "unix:///var/run/docker.sock",
        "unix:///run/user/1000/docker.sock",
        "unix:///run/user/1000/podman/podman.sock",
    ]
    assert engine_sockets({}, 0)[0] == "unix:///var/run/docker.sock" and len(engine_sockets({}, 0)) == 4
    podman = engine_summary(
        {"Version": "4.3.1", "Components": [{"Name": "Podman Engine"}]},
        {"SecurityOptions": ["name=seccomp,profile=default", "name=rootless"], "Runtimes": {"runsc": {}}},
    )
    assert podman["flavor"] == "podman" and podman["rootless"] and podman["kinds"] == ["container"]
    assert "--oci-seccomp" in podman["gvisor_problem"]
    args = {"runtimeArgs": ["--oci-seccomp", "--overlay2=none"]}
    docker = engine_summary({"Version": "28.2.2"}, {"SecurityOptions": ["name=userns"], "Runtimes": {"runsc": args}})
    assert docker == {
        "flavor": "docker",
        "version": "28.2.2",
        "rootless": False,
        "userns": True,
        "kinds": ["gvisor", "container"],
        "gvisor_problem": None,
        "limits_problem": None,
    }
    # rootless on cgroup v1 (Podman says so in `Rootless`): no kind, the limits would not hold there
    v1 = engine_summary({"Components": [{"Name": "Podman Engine"}]}, {"Rootless": True, "CgroupVersion": "1"})
    assert v1["rootless"] and v1["kinds"] == [] and "cgroup v1" in v1["limits_problem"]
    v2 = engine_summary({"Components": [{"Name": "Podman Engine"}]}, {"Rootless": True, "CgroupVersion": "2"})
    assert v2["kinds"] == ["container"] and v2["limits_problem"] is None


def test_an_oom_flag_the_engine_sets_after_the_exit_is_still_read() -> None:
    """The engine sets State.OOMKilled from an event of its own, which can come after the exit on a loaded host
    (a gVisor pass saw exit 137 with the flag still false): the run is then oom_killed, not a crash. A SIGKILLed
    worker with no OOM at all is a crash once the short wait is over; any other exit is not waited on."""
    from toolcage.backends import container

    class Engine:
        def __init__(self, states: list[dict[str, Any]], asked: bool | None) -> None:
            self.states, self.inspected, self.asked = states, 0, asked

        def wait(self, cid: str, timeout: float) -> int:
            return int(self.states[0]["ExitCode"])

        def inspect(self, cid: str) -> dict[str, Any]:
            self.inspected += 1
            return {"State": self.states[min(self.inspected, len(self.states)) - 1]}

        def kill_requested(self, cid: str, since: float) -> bool | None:
            return self.asked

    def status(states: list[dict[str, Any]], asked: bool | None = None) -> tuple[ExitStatus, int]:
        backend = object.__new__(container.ContainerBackend)
        backend.container_id, backend._engine = "c", Engine(states, asked)
        got = backend.exit_status(5)
        return got, backend._engine.inspected

    late = [
        {"ExitCode": 137, "OOMKilled": False},
        {"ExitCode": 137, "OOMKilled": False},
        {"ExitCode": 137, "OOMKilled": True},
    ]
    got, inspected = status(late)
    assert got.oom_killed and got.exit_code == 137 and inspected == 3
    got, inspected = status([{"ExitCode": 137, "OOMKilled": False}])
    assert not got.oom_killed and inspected > 2  # looked at again, for OOM_EVENT_WAIT_S
    got, inspected = status([{"ExitCode": 1, "OOMKilled": False}])
    assert not got.oom_killed and inspected == 1


def test_a_killed_worker_waits_for_the_oom_flag_only_when_nobody_asked_the_engine_to_kill_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 137 with no OOM flag yet: when the engine's events show a kill someone asked for (docker kill, rm -f)
    it is a crash at once; when they show none (the kernel killed it) the flag is waited for longer than the
    short look (a loaded gVisor pass saw it come after 0.3 s), so a late flag is still read as oom_killed."""
    from toolcage.backends import container

    monkeypatch.setattr(container, "OOM_EVENT_WAIT_S", 0.05)
    monkeypatch.setattr(container, "OOM_EVENT_LATE_S", 0.6)

    class Engine:
        def __init__(self, asked: bool | None, flag_after_s: float, oom_event: bool | None) -> None:
            self.asked, self.flag_at, self.inspected = asked, time.monotonic() + flag_after_s, 0
            self.oom_event = oom_event

        def wait(self, cid: str, timeout: float) -> int:
            return 137

        def inspect(self, cid: str) -> dict[str, Any]:
            self.inspected += 1
            return {"State": {"ExitCode": 137, "OOMKilled": time.monotonic() >= self.flag_at}}

        def kill_requested(self, cid: str, since: float) -> bool | None:
            return self.asked

        def oom_reported(self, cid: str, since: float) -> bool | None:
            return self.oom_event

    def status(
        asked: bool | None, flag_after_s: float = 60.0, oom_event: bool | None = False
    ) -> tuple[ExitStatus, int, float]:
        backend = object.__new__(container.ContainerBackend)
        backend.container_id, backend._engine = "c", Engine(asked, flag_after_s, oom_event)
        started = time.monotonic()
        got = backend.exit_status(5)
        return got, backend._engine.inspected, time.monotonic() - started

    got, inspected, took = status(asked=False, flag_after_s=0.3)  # the kernel's kill, its flag late
    assert got.oom_killed and took >= 0.3, (got, took)
    got, inspected, took = status(asked=True)  # docker kill: no wait
    assert not got.oom_killed and inspected == 1 and took < 0.05, (got, inspected, took)
    got, inspected, took = status(asked=None)  # the engine cannot say: the short look
    assert not got.oom_killed and 0.05 <= took < 0.6, (got, took)
    # the kernel's kill whose flag never comes (Docker 20.10 lost it at the exit under a loaded gVisor pass): the
    # engine's oom event decides; none, or none it can tell of, is a crash
    got, inspected, took = status(asked=False, oom_event=True)
    assert got.oom_killed and took >= 0.6, (got, took)
    for event in (False, None):
        got, inspected, took = status(asked=False, oom_event=event)
        assert not got.oom_killed, (got, event)


class _ExitedEngine:
    """An engine whose container exited with ``code``, never OOM-killed (for what ``exit_status`` says of it)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def wait(self, cid: str, timeout: float) -> int:
        return self.code

    def inspect(self, cid: str) -> dict[str, Any]:
        return {"State": {"ExitCode": self.code, "OOMKilled": False}}


def _why(cls: type, code: int) -> str:
    backend = object.__new__(cls)
    backend.container_id, backend._engine = "c", _ExitedEngine(code)
    return str(backend.exit_status(5).why)


def test_a_gvisor_worker_that_exits_2_is_said_to_be_gvisors_kernel_ending() -> None:
    """Exit code 2 under gVisor is runsc's sentry ending (met by the host's backstop limits on its own threads
    or memory): the crash says so and where to read more. Any other exit, and exit 2 under runc, says nothing more."""
    from toolcage.backends import container, gvisor

    said = _why(gvisor.GVisorBackend, 2)
    assert "gVisor's kernel ended" in said and "docs/operating.md" in said
    assert _why(gvisor.GVisorBackend, 1) == "" and _why(container.ContainerBackend, 2) == ""


def test_a_worker_that_could_not_lay_its_cached_copy_says_so() -> None:
    """Exit 75 (contract.EXIT_NO_COPY) is the worker refusing to serve a cached copy it could not lay: the crash says
    that and what to do; any other exit says nothing of it."""
    from toolcage.backends import container
    from toolcage.policies import contract

    said = _why(container.ContainerBackend, contract.EXIT_NO_COPY)
    assert "cached workspace copy" in said and "workspace_cache" in said
    assert _why(container.ContainerBackend, 1) == "" and _why(container.ContainerBackend, 70) == ""
