"""Shared test set-up: tests under integration/ and security/ need the real Docker engine.

They are marked ``docker`` automatically. Without an engine or the worker image they
FAIL with a message saying what to do; they never skip.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import wait_removed

ROOT = Path(__file__).resolve().parent
pytest_plugins = ["tests.foreign_conftest_plugin"]  # foreign_image, foreign_images_all (issue 36)


def pytest_configure(config: pytest.Config) -> None:
    """Tests write their audit records to a file of their own, never the user's log; and their `toolcage run`
    runs in its own process, never in a daemon this user may have started (tests/integration/test_daemon.py
    starts daemons of its own)."""
    import tempfile

    if "TOOLCAGE_AUDIT_LOG" not in os.environ:
        os.environ["TOOLCAGE_AUDIT_LOG"] = os.path.join(tempfile.mkdtemp(prefix="toolcage-test-audit-"), "audit.jsonl")
    os.environ["TOOLCAGE_DAEMON"] = "off"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the README's test commands): the suites run in this many processes, one file each at a time
    (``--dist loadfile``, so a module's shared sandbox stays in one process). The Docker tests mostly wait (on
    the engine, on timeouts, on a sandbox's removal), so one more process than there are cores keeps the
    cores busy; more than four only adds contention on the engine. ``TOOLCAGE_TEST_WORKERS`` sets it."""
    asked = os.environ.get("TOOLCAGE_TEST_WORKERS", "").strip()
    if asked:
        try:
            return max(1, int(asked))
        except ValueError:
            raise pytest.UsageError(f"TOOLCAGE_TEST_WORKERS={asked!r}: a whole number of processes") from None
    return min((os.cpu_count() or 1) + 1, 4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    under_gvisor = os.environ.get("TOOLCAGE_SANDBOX") == "gvisor"
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT)
        if rel.parts[0] in ("integration", "security"):
            item.add_marker(pytest.mark.docker)
        if under_gvisor and item.nodeid in GVISOR_KNOWN:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"known gVisor gap: {GVISOR_KNOWN[item.nodeid]}"))
        runc_only = item.get_closest_marker("runc_only")
        if runc_only is not None and not _reason_given(runc_only):
            raise pytest.UsageError(f"{item.nodeid}: runc_only needs its reason, a non-empty string: runc_only('why')")


# The second pass of the integration and security suites (TOOLCAGE_SANDBOX=gvisor, as .ci/run does):
# the tests that meet a known gap of gVisor, each with it. Strict: a gap that closes turns its tests
# red, so this list cannot go stale; a test not listed passes under gVisor as under runc.
_CGROUP = "gVisor's own cgroupfs shows no memory limit to the worker"
GVISOR_KNOWN: dict[str, str] = {
    "tests/security/test_connector_secrets.py::test_premise_a_surviving_daemon_reads_later_handlers": (
        "the premise (a surviving daemon reads a later handler's memory) does not hold under gVisor"
    ),
    "tests/security/test_isolation.py::test_attack_case[memory_limit_visible]": _CGROUP,
    "tests/security/test_mcp_wrap_attacks.py::test_a_failing_server_ends_with_a_clear_error[stdout-flood]": (
        "not explained yet: a wrapped server's 17 MiB line under gVisor is never seen (not within 57 s either: "
        "not a matter of speed); the call still ends, at its timeout, and nothing is left"
    ),
}


def _reason_given(mark: pytest.Mark) -> bool:
    """runc_only(reason): one non-empty string saying why the test is left to the runc pass."""
    args = [*mark.args, *mark.kwargs.values()]
    return len(args) == 1 and isinstance(args[0], str) and bool(args[0].strip())


@pytest.fixture(scope="session")
def engine() -> Any:
    """The real Docker engine, with the worker image present; fails loudly otherwise."""
    from toolcage import DEFAULT_IMAGE, ToolcageError
    from toolcage.engine.docker_adapter import Engine

    try:
        eng = Engine.default()
        eng.ping()
    except ToolcageError as exc:
        pytest.fail(f"Docker is required for this test and is not reachable: {exc}", pytrace=False)
    image = os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE)
    if eng.image(image) is None:
        pytest.fail(f"worker image {image} is missing: run `toolcage image build` first", pytrace=False)
    return eng


@pytest.fixture
def internal_net(engine: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """An internal Docker network for an egress proxy (it runs and answers; nothing leaves the machine),
    named after the test module, removed after the test's runs are."""
    tag = secrets.token_hex(3)
    net = f"toolcage-test-{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_')[:16]}-{tag}"
    engine.create_network(net, internal=True, labels={"toolcage.test": tag})
    try:
        yield net
    finally:
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


def _mine(eng: Any) -> list[dict[str, Any]]:
    """Containers created by this test process (owner label host:pid)."""
    from toolcage.engine import ownership

    host_pid, _ = ownership.owner()
    return [c for c in eng.containers("toolcage.run_id") if c["Labels"].get("toolcage.owner") == host_pid]


@pytest.fixture
def no_leaks(engine: Any) -> Iterator[None]:
    """Fails a test that leaves one of its containers behind (and removes it anyway)."""
    before = {c["Id"] for c in _mine(engine)}
    yield
    wait_removed(60)  # closed sandboxes are removed in the background
    leaked = [c for c in _mine(engine) if c["Id"] not in before]
    for c in leaked:
        engine.remove(c["Id"])
    assert not leaked, f"containers left behind: {[c['Names'] for c in leaked]}"


@pytest.fixture
def wrap_lock() -> Iterator[None]:
    """Held while a test makes `mcp wrap` runs: one such test at a time across the test processes (``-n``).
    A wrap run is a `toolcage` subprocess, so its objects carry that process's owner label, not the test
    process's: no_wrap_leaks can tell a leak from another process's run only if none is under way."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "toolcage-test-wrap.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture
def no_wrap_leaks(engine: Any, wrap_lock: None) -> Iterator[None]:
    """Fails a test after which a container, network or volume of a wrap run is left."""
    from tests.helpers import wrap_objects

    before = wrap_objects(engine)
    yield
    left = wrap_objects(engine) - before
    assert not left, f"left behind: {sorted(left)}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A test ends when the sandboxes it closed are removed (in the background), before its
    fixtures are torn down (a network fixture cannot be removed while a proxy still uses it)."""
    wait_removed(60)


@pytest.fixture(scope="session", autouse=True)
def _final_sweep() -> Iterator[None]:
    """At the end of the session remove anything this process created, whatever happened: its containers,
    and the shared-files volumes of images it made and removed (toolcage.engine.sharedfiles)."""
    from toolcage.engine import sharedfiles

    try:
        from toolcage.engine.docker_adapter import Engine

        before = {v["Name"] for v in Engine.default().volumes(sharedfiles.LABEL)}
    except Exception:
        before = None
    yield
    try:
        from toolcage.engine.docker_adapter import Engine

        eng = Engine.default()
        for c in _mine(eng):
            eng.remove(c["Id"])
        if before is not None:
            for kind, name, _ in sharedfiles.stale(eng):
                if kind == "volume" and name not in before:
                    eng.remove_volume(name)
    except Exception:
        pass
