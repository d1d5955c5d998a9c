"""Harbor itself (0.25, Python 3.13 in a trixie runner image) runs a job of the toy tasks in toolcage sandboxes
(issue 39): ``harbor run --env toolcage.integrations.harbor:ToolcageEnvironment`` with the oracle agent, each
trial's reward 1.0, each sandbox a toolcage container of the task's image (its labels), nothing left after.

The runner image is built by examples/harbor/build_runner.py (debootstrap, a chroot pip install, docker import)
and reused while its content digest holds. Then Harbor's own classes are checked inside it
(harbor_env_checks.py: capabilities, users, network refusals, exec, files).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.runc_only("Harbor's orchestration on the host (its runner image, the job's files): host-side")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "harbor"
TASKS = ("count-words", "fidelity", "hello")
ENV = "toolcage.integrations.harbor:ToolcageEnvironment"
SOCK = "/var/run/docker.sock:/var/run/docker.sock"


def _builder() -> Any:
    spec = importlib.util.spec_from_file_location("harbor_build_runner", EXAMPLE / "build_runner.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runner() -> str:
    """The runner image's tag (built if its digest's tag is missing; the build's seconds printed)."""
    began = time.monotonic()
    ref: str = _builder().build(report=True)
    print(f"\nrunner image {ref}: {time.monotonic() - began:.1f} s")
    return ref


def _seconds(phase: dict[str, Any]) -> float:
    return (datetime.fromisoformat(phase["finished_at"]) - datetime.fromisoformat(phase["started_at"])).total_seconds()


def _events(since: str, out: list[dict[str, Any]]) -> tuple[subprocess.Popen[str], threading.Thread]:
    """Containers created with toolcage's harbor label while the job runs (docker events, as JSON lines)."""
    argv = ["docker", "events", "--since", since, "--format", "{{json .}}", "--filter", "type=container"]
    argv += ["--filter", "event=create", "--filter", "label=toolcage.tool=harbor"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

    def read() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                out.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, reader


def _harbor(runner: str, tasks: Path, jobs: Path) -> subprocess.CompletedProcess[str]:
    """``harbor run`` of ``tasks`` with the oracle, in the runner's container (no network), job ``toy``."""
    argv = ["docker", "run", "--rm", "--network", "none", "-e", "COLUMNS=400", "-v", SOCK, "-v", f"{tasks}:/tasks:ro"]
    argv += ["-v", f"{jobs}:/jobs", runner, "harbor", "run", "-p", "/tasks", "-a", "oracle", "--env", ENV]
    argv += ["-o", "/jobs", "--job-name", "toy", "-n", "3", "-y"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def test_harbor_runs_the_toy_tasks_in_toolcage_sandboxes(runner: str, tmp_path: Path) -> None:
    """Each trial's reward is 1.0; each environment was a toolcage sandbox of the task's image; none is left."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    created: list[dict[str, Any]] = []
    since = str(int(time.time()) - 1)
    watcher, reader = _events(since, created)
    began = time.monotonic()
    job = _harbor(runner, EXAMPLE / "tasks", jobs)
    wall = time.monotonic() - began
    time.sleep(1)  # the last events reach the watcher
    watcher.terminate()
    watcher.wait()
    reader.join(10)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]

    trials = {d.name.partition("__")[0]: d for d in (jobs / "toy").iterdir() if d.is_dir()}
    assert sorted(trials) == sorted(TASKS)
    run_ids, figures = {}, []
    for task, trial in sorted(trials.items()):
        result = json.loads((trial / "result.json").read_text())
        assert result["exception_info"] is None, (task, result["exception_info"])
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}, (task, result["verifier_result"])
        log = (trial / "trial.log").read_text()
        started = [ln for ln in log.splitlines() if ln.startswith("toolcage sandbox run_id=") and "container=" in ln]
        assert len(started) == 1, log[-2000:]
        fields = dict(kv.split("=", 1) for kv in started[0].split()[2:])
        assert fields["image"] == "toolcage-harbor-task:1"
        run_ids[fields["run_id"]] = fields["container"]
        removed = next(ln for ln in log.splitlines() if "removed; calls/seconds:" in ln)
        spent = {
            k: float(v.split("/")[1].rstrip("s")) for k, v in (p.split("=") for p in removed.split(": ")[1].split())
        }
        figures.append(
            f"{task}: trial {_seconds(result):.2f} s (environment setup {_seconds(result['environment_setup']):.2f}, "
            f"oracle {_seconds(result['agent_execution']):.2f}, verifier {_seconds(result['verifier']):.2f}); "
            f"the commands' own time {spent['process']:.3f} s, sandbox start {spent['start']:.2f} s"
        )
    print(f"harbor job: {wall:.1f} s wall for {len(TASKS)} trials at -n 3\n" + "\n".join(figures))

    # each environment was a toolcage container of the task's image, labelled with its run id
    sandboxes = {e["Actor"]["Attributes"].get("name"): e["Actor"]["Attributes"] for e in created}
    for run_id, name in run_ids.items():
        attrs = sandboxes.get(name)
        assert attrs is not None, (name, sorted(n for n in sandboxes if n))
        assert attrs["toolcage.run_id"] == run_id and attrs["image"] == "toolcage-harbor-task:1"

    # the download kept the verifier's tree: a mode, a symlink, an empty directory
    tree = trials["fidelity"] / "verifier" / "tree"
    assert stat.S_IMODE((tree / "run.sh").lstat().st_mode) == 0o750
    assert os.readlink(tree / "sub-link") == "run.sh" and list((tree / "empty-dir").iterdir()) == []
    assert "proxy refused pypi.org: 403" in (trials["fidelity"] / "verifier" / "checks.txt").read_text()

    # nothing is left: no container, network or volume of these runs
    for run_id in run_ids:
        for kind in ("ps -a", "network ls", "volume ls"):
            left = subprocess.run(
                ["docker", *kind.split(), "-q", "--filter", f"label=toolcage.run_id={run_id}"],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            assert not left, (kind, run_id, left)


def test_harbors_classes_take_the_environment(runner: str) -> None:
    """Inside the runner, with Harbor's own models: capabilities, refusals, users, exec, files (harbor_env_checks)."""
    checks = Path(__file__).with_name("harbor_env_checks.py")
    argv = ["docker", "run", "--rm", "--network", "none", "-v", SOCK, "-v", f"{checks}:/checks.py:ro", runner]
    proc = subprocess.run([*argv, "python3", "/checks.py"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.split().count("ok") == 5, proc.stdout


def test_a_network_policy_changed_live_between_the_phases(runner: str, tmp_path: Path) -> None:
    """The phases task (agent: allowed.example allowed; verifier: nothing): with ``AsyncSandbox.update_network`` the
    verifier phase runs with nothing allowed, reward 1.0; without it Harbor refuses the task, saying why."""
    probe = ["docker", "run", "--rm", "--network", "none", runner, "python3", "-c"]
    dynamic = subprocess.run(
        [*probe, "from toolcage.integrations.harbor import DYNAMIC; print(DYNAMIC)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    job = _harbor(runner, EXAMPLE / "tasks-dynamic", jobs)
    if dynamic != "True":
        said = " ".join(re.sub("[│╭╮╰╯─]", " ", job.stdout + job.stderr).split())
        assert "this environment cannot change network policy after start" in said, said[-3000:]
        return
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    (trial,) = [d for d in (jobs / "toy").iterdir() if d.is_dir()]
    checks = (trial / "verifier" / "checks.txt").read_text()
    result = json.loads((trial / "result.json").read_text())
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}, checks
    assert "port 8080 is not allowed" in checks.splitlines()[0], checks
    assert "host allowed.example is not in the allowlist" in checks.splitlines()[1], checks
    assert "changed live" in (trial / "trial.log").read_text()
