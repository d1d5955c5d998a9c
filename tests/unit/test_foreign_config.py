"""A user's own image (issue 36): the container's settings as values, without Docker.

The image's config is data: its ENTRYPOINT and CMD never run (the worker starts from the runtime mount by
absolute path), each of its variables is blanked for the worker's own process (LD_PRELOAD, PYTHONSTARTUP,
...), and every hardening knob is the worker image's."""

from __future__ import annotations

import json

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine.hostconfig import container_config, proxy_container_config
from toolcage.engine.imageconfig import WORKER_ENV, BadImageConfig, from_inspect
from toolcage.engine.runtime import ENTRYPOINT
from toolcage.policies import contract, load_policy

HOSTILE = {
    "Id": "sha256:" + "ab" * 32,
    "Config": {
        "Env": ["PATH=/evil/bin:/usr/bin:/bin", "LD_PRELOAD=/evil/evil.so", "PYTHONSTARTUP=/evil/s.py", "MYVAR=x=y"],
        "WorkingDir": "/testbed",
        "User": "0",
        "Entrypoint": ["/evil/bin/sh", "-c", "echo pwned"],
        "Cmd": ["serve"],
    },
}


def _env(cfg: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in cfg["Env"])


def test_image_config_is_read_as_values() -> None:
    img = from_inspect("evil:1", HOSTILE)
    assert img.env == (("PATH", "/evil/bin:/usr/bin:/bin"), ("LD_PRELOAD", "/evil/evil.so"),
                       ("PYTHONSTARTUP", "/evil/s.py"), ("MYVAR", "x=y"))  # fmt: skip
    assert (img.workdir, img.user, img.cmd) == ("/testbed", "0", ("serve",))
    assert img.entrypoint == tuple(HOSTILE["Config"]["Entrypoint"])


def test_the_worker_starts_from_the_runtime_never_the_images_entrypoint() -> None:
    img = from_inspect("evil:1", HOSTILE)
    cfg = container_config(load_policy("default"), run_spec(foreign=img, runtime_mounts=(("rtv", "/opt/toolcage/rt"),)))
    assert cfg["Entrypoint"] == list(ENTRYPOINT) and ENTRYPOINT[0].startswith("/opt/toolcage/rt/")
    assert cfg["Cmd"] == []
    assert cfg["User"] == f"{contract.SANDBOX_UID}:{contract.SANDBOX_UID}"  # never the image's USER 0
    hc = cfg["HostConfig"]
    assert hc["ReadonlyRootfs"] is True and hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
    rt = [m for m in hc["Mounts"] if m["Target"] == "/opt/toolcage/rt"]
    assert rt == [{"Type": "volume", "Source": "rtv", "Target": "/opt/toolcage/rt", "ReadOnly": True,
                   "VolumeOptions": {"NoCopy": True}}]  # fmt: skip


def test_every_image_variable_is_blanked_for_the_worker() -> None:
    img = from_inspect("evil:1", HOSTILE)
    env = _env(container_config(load_policy("default"), run_spec(foreign=img)))
    assert env["LD_PRELOAD"] == "" and env["PYTHONSTARTUP"] == "" and env["MYVAR"] == ""
    for key, value in WORKER_ENV.items():
        assert env[key] == value
    assert env["PATH"] == "/opt/toolcage/rt/bin"
    handed = json.loads(env[contract.ENV_IMAGE_CONFIG])
    assert ["LD_PRELOAD", "/evil/evil.so"] in handed["env"] and handed["workdir"] == "/testbed"


def test_the_policy_still_wins_over_anything_the_image_says() -> None:
    bad = {"Id": "x", "Config": {"Env": [f"{contract.ENV_POLICY}={{}}", f"{contract.ENV_DEADLINE}=9999999999"]}}
    spec = run_spec(foreign=from_inspect("x", bad))
    env = _env(container_config(load_policy("default"), spec))
    assert env[contract.ENV_POLICY] == load_policy("default").canonical_json()
    assert env[contract.ENV_DEADLINE] == f"{spec.deadline:.3f}"


def test_mcp_wraps_launcher_uses_the_runtimes_python() -> None:
    spec = run_spec(foreign=from_inspect("x", HOSTILE), entrypoint=("python3", "-S", "-m", "toolcage.worker.mcp_host"))
    assert container_config(load_policy("default"), spec)["Entrypoint"][0] == ENTRYPOINT[0]


def test_the_proxy_of_a_foreign_run_is_the_worker_image_alone() -> None:
    spec = run_spec(foreign=from_inspect("x", HOSTILE), runtime_mounts=(("rtv", "/opt/toolcage/rt"),),
                    proxy_volume="pv", image="toolcage-worker:test")  # fmt: skip
    cfg = proxy_container_config(load_policy("default"), spec, "egress-net", None)
    assert contract.ENV_IMAGE_CONFIG not in _env(cfg) and "LD_PRELOAD" not in _env(cfg)
    assert all(m["Target"] != "/opt/toolcage/rt" for m in cfg["HostConfig"]["Mounts"])
    assert cfg["Entrypoint"][0] == "python3"


@pytest.mark.parametrize(
    "config",
    [{"Env": [f"V{i}=1" for i in range(5000)]}, {"Env": ["BIG=" + "x" * 300_000]}],
    ids=["too-many-variables", "too-large"],
)
def test_a_config_too_large_is_refused(config: dict) -> None:
    with pytest.raises(BadImageConfig):
        from_inspect("big", {"Id": "x", "Config": config})
