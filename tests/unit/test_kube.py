"""The Kubernetes backend on paper (toolcage.backends.kubernetes): each manifest it renders is valid and hardened.

No API server can run here, so each object is checked against the schemas the API publishes, with
kubernetes-validate in strict mode (an unknown field fails, as ``kubectl --validate=strict`` would), for
the oldest Kubernetes this design needs (1.33: user namespaces on by default, recursive read-only mounts
GA) and the newest the package bundles. agent-sandbox's kinds are checked against their CRDs' own
openAPIV3Schema, vendored in tests/unit/data/agent_sandbox_crds.json (its commit is in the file). What
the schemas leave to the API server's code (label syntax, names, quantities) is checked here as well.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.unit._helpers import run_spec
from toolcage.backends import kubernetes as kube
from toolcage.engine.hostconfig import container_config, proxy_container_config
from toolcage.engine.knobs import GVISOR, RUNC
from toolcage.engine.labels import LABEL_POOL, LABEL_ROLE, LABEL_RUN_ID, RunSpec, labels
from toolcage.policies import Policy, bundled_policy_names, contract, load_policy
from toolcage.policies.addresses import address_problem
from toolcage.policies.model import AllowRule, NetworkPolicy

OLDEST = "1.33"
VERSIONS = (OLDEST, kubernetes_validate.utils.latest_version())
CRDS = json.loads((Path(__file__).parent / "data" / "agent_sandbox_crds.json").read_text())
PROXY_IP = "10.96.12.34"
RUNC_AT, GVISOR_AT = kube.Placement(), kube.Placement(runtime_class="gvisor")
OWNER = kube.OwnerRef("toolcage-run-python-abcd1234", "6a1f0c5e-0000-4000-8000-000000000001")
# a proxy policy with more to render: two schemes, an explicit port, an IP-literal host, a private range
WIDE = Policy(
    name="wide",
    network=NetworkPolicy(
        mode="proxy",
        allow=(
            AllowRule(host="api.example.com", schemes=("http", "https")),
            AllowRule(host="203.0.114.9", ports=(8443,)),
        ),
        allow_private_cidrs=("10.20.0.0/16",),
    ),
)


def policies() -> list[Policy]:
    """Every bundled policy (network none and proxy among them) and WIDE."""
    found = [load_policy(name) for name in bundled_policy_names()]
    assert {p.network.mode for p in found} == {"none", "proxy"}
    return [*found, WIDE]


def runs(policy: Policy) -> Iterator[tuple[str, RunSpec, kube.Placement, dict[str, Any]]]:
    """(case, run, placement, extra arguments) under runc and gVisor, with each kind of workspace."""
    proxy = {"proxy_address": PROXY_IP} if policy.network.mode == "proxy" else {}
    for name, spec, where in (
        ("runc", run_spec(), RUNC_AT),
        ("gvisor", run_spec(runtime=GVISOR, proxy_runtime=GVISOR), GVISOR_AT),
    ):
        yield f"{policy.name}-{name}", spec, where, proxy
        yield f"{policy.name}-{name}-claim", spec, where, {**proxy, "workspace_claim": "repo-ro"}
        yield f"{policy.name}-{name}-copy", replace(spec, workspace_copy=True), where, proxy


def every_manifest() -> Iterator[tuple[str, dict[str, Any]]]:
    """(case, manifest) for everything toolcage.backends.kubernetes renders."""
    for policy in policies():
        for case, run, where, extra in runs(policy):
            for m in kube.run_manifests(policy, run, where, owner=OWNER, **extra):
                yield f"{case}-{m['kind']}-{m['metadata']['name']}", m
    yield "namespace", kube.namespace(RUNC_AT)
    yield "baseline", kube.baseline_network_policy(RUNC_AT)
    yield "runtimeclass", kube.runtime_class(GVISOR, node_selector={"sandbox.toolcage/gvisor": "true"})


def agent_sandbox_manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    """(case, manifest) for the warm-pool kinds, for every policy a warm Pod can serve (network none)."""
    for policy in policies():
        if policy.network.mode != "none":
            continue
        for runtime, where in ((RUNC, RUNC_AT), (GVISOR, GVISOR_AT)):
            case = f"{policy.name}-{runtime.name or 'runc'}"
            yield case, kube.sandbox_template(policy, "p1", "toolcage-worker:test", where, runtime=runtime)
            yield (
                f"{case}-claim",
                kube.sandbox_template(
                    policy, "p2", "toolcage-worker:test", where, runtime=runtime, workspace_claim="repo-ro"
                ),
            )
        yield f"{policy.name}-pool", kube.warm_pool("p1", 4, RUNC_AT)
        yield f"{policy.name}-claim", kube.sandbox_claim(policy, run_spec(), "p1", RUNC_AT)


ALL = list(every_manifest())
WARM = list(agent_sandbox_manifests())


# -- what the API server's code checks and the schemas do not ---------------------------------------
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_QUANTITY = r"[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?"


def syntax_problems(m: dict[str, Any]) -> list[str]:
    """What the API server's validation code (not its schema) would refuse: names, label keys and values,
    annotation keys, quantities, nulls."""
    bad = []
    meta = m["metadata"]
    name_rule = r"[a-z]([-a-z0-9]*[a-z0-9])?" if m["kind"] == "Service" else _DNS_SUBDOMAIN
    if not (re.fullmatch(name_rule, meta["name"]) and len(meta["name"]) <= 63):
        bad.append(f"name {meta['name']!r}")
    keys = [*meta.get("labels", {}), *meta.get("annotations", {})]
    for key in keys:
        prefix, _, name = key.rpartition("/")
        if not (re.fullmatch(_NAME, name) and len(name) <= 63) or (prefix and not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
            bad.append(f"key {key!r}")
    for key, value in meta.get("labels", {}).items():
        if len(value) > 63 or (value and not re.fullmatch(_NAME, value)):
            bad.append(f"label value {key}={value!r}")
    for path, value in _walk(m):
        if path.endswith(".ipBlock.cidr"):
            bad += _ip_block_problems(m, path.removesuffix(".cidr"))
        if value is None:
            bad.append(f"null at {path}")
        elif re.search(r"\.(limits|requests)\.[a-z-]+$|sizeLimit$", path) and not re.fullmatch(_QUANTITY, value):
            bad.append(f"quantity {path}={value!r}")
    return bad


def _ip_block_problems(m: dict[str, Any], path: str) -> list[str]:
    """The API server's rule for an ipBlock: each exception a strict subset of the CIDR, of its family."""
    block: Any = m
    for part in re.findall(r"\.(\w+)|\[(\d+)\]", path):
        block = block[part[0]] if part[0] else block[int(part[1])]
    cidr = ipaddress.ip_network(block["cidr"])
    bad = []
    for text in block.get("except", []):
        sub = ipaddress.ip_network(text)
        if sub.version != cidr.version or not sub.subnet_of(cidr) or sub == cidr:  # type: ignore[arg-type]
            bad.append(f"except {text} outside {cidr} at {path}")
    return bad


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, node


def validate_crd(m: dict[str, Any]) -> None:
    """Validate against the vendored CRD schema, made strict as the API server's fieldValidation=Strict is
    (an unknown field fails; maps and x-kubernetes-preserve-unknown-fields stay open); metadata against
    Kubernetes' own ObjectMeta (through a ConfigMap that carries it), and a template's Pod spec against
    Kubernetes' own PodSpec too."""
    assert m["apiVersion"] == CRDS["version"] == kube.AGENT_SANDBOX_API
    schema = _strict(copy.deepcopy(CRDS["schemas"][m["kind"]]))
    jsonschema.Draft7Validator(schema).validate(m)
    for version in VERSIONS:
        carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": m["metadata"]}
        kubernetes_validate.validate(carrier, version, strict=True)
        if m["kind"] == "SandboxTemplate":
            template = m["spec"]["podTemplate"]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **template["metadata"]}}
            kubernetes_validate.validate({**pod, "spec": template["spec"]}, version, strict=True)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    open_ = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_:
        schema["additionalProperties"] = False
    for key in ("properties", "patternProperties"):
        for sub in schema.get(key, {}).values():
            _strict(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []):
            _strict(sub)
    return schema


# -- validity -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("case", "manifest"), ALL, ids=[c for c, _ in ALL])
def test_every_manifest_validates_against_the_kubernetes_schema(case: str, manifest: dict[str, Any]) -> None:
    """Each rendered object is valid, strictly, for Kubernetes 1.33 and the newest bundled, and passes the
    API server's syntax rules the schema leaves out."""
    for version in VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)
    assert syntax_problems(manifest) == []


@pytest.mark.parametrize(("case", "manifest"), WARM, ids=[c for c, _ in WARM])
def test_agent_sandbox_kinds_validate_against_their_crds(case: str, manifest: dict[str, Any]) -> None:
    """SandboxTemplate, SandboxWarmPool and SandboxClaim are valid for agent-sandbox's v1beta1 CRDs."""
    validate_crd(manifest)
    assert syntax_problems(manifest) == []


def test_the_cases_cover_what_the_design_names() -> None:
    """Both network modes, runc and gVisor, and every kind the doc lists are among the validated."""
    kinds = {m["kind"] for _, m in ALL} | {m["kind"] for _, m in WARM}
    assert kinds == {"Pod", "Service", "NetworkPolicy", "Namespace", "RuntimeClass", "SandboxTemplate",
                     "SandboxWarmPool", "SandboxClaim"}  # fmt: skip
    assert any(m["spec"].get("runtimeClassName") == "gvisor" for _, m in ALL if m["kind"] == "Pod")
    assert any(m["metadata"]["name"].endswith("-egress") for _, m in ALL if m["kind"] == "Pod")
    assert VERSIONS[0] != VERSIONS[1]


# -- the checks can fail --------------------------------------------------------------------------------
def test_the_validators_reject_wrong_manifests() -> None:
    """A misspelt field, a wrong type, an unknown CRD field, a bad enum and a sha256 as a label value are
    all refused (so a pass above means something)."""
    pod = kube.sandbox_pod(load_policy("default"), run_spec(), RUNC_AT)
    misspelt = copy.deepcopy(pod)
    misspelt["spec"]["containers"][0]["stdin_once"] = misspelt["spec"]["containers"][0].pop("stdinOnce")
    wrong_type = copy.deepcopy(pod)
    wrong_type["spec"]["activeDeadlineSeconds"] = "62"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, OLDEST, strict=True)
    claim = kube.sandbox_claim(load_policy("default"), run_spec(), "p1", RUNC_AT)
    unknown, enum = copy.deepcopy(claim), copy.deepcopy(claim)
    unknown["spec"]["lifecycle"]["ttl"] = 5
    enum["spec"]["lifecycle"]["shutdownPolicy"] = "Never"
    for bad in (unknown, enum):
        with pytest.raises(jsonschema.ValidationError):
            validate_crd(bad)
    np = kube.proxy_network_policy(load_policy("connector-http"), run_spec(), RUNC_AT)
    np["spec"]["egress"][0]["to"][0]["ipBlock"]["except"].append("fc00::/7")
    assert syntax_problems(np) == ["except fc00::/7 outside 0.0.0.0/0 at .spec.egress[0].to[0].ipBlock"]
    sha = copy.deepcopy(pod)
    sha["metadata"]["labels"]["toolcage.policy_sha256"] = "a" * 64
    assert syntax_problems(sha) == ["label value toolcage.policy_sha256='" + "a" * 64 + "'"]


# -- hardening -------------------------------------------------------------------------------------------
def pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for case, m in ALL:
        if m["kind"] == "Pod":
            yield case, m
    for case, m in WARM:
        if m["kind"] == "SandboxTemplate":
            yield case, {"kind": "Pod", "metadata": {"name": case}, "spec": m["spec"]["podTemplate"]["spec"]}


def test_every_pod_is_hardened_as_the_docker_backend_is() -> None:
    """No token, no service links, never restarted, a deadline, no host namespaces, its own user namespace
    under runc;
    the container non-root (SANDBOX_UID), read-only root, no privilege escalation, every capability dropped,
    toolcage's seccomp profile; only memory-backed emptyDir and read-only claims as volumes (PSA restricted)."""
    for case, pod in pods():
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False, case
        assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0, case
        assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"]), case
        assert "serviceAccountName" not in spec and spec["shareProcessNamespace"] is False
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == sc["runAsGroup"] == contract.SANDBOX_UID, case
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, case
        assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}, case
        gvisor = spec.get("runtimeClassName") == "gvisor"
        assert spec.get("hostUsers") is (None if gvisor else False), case  # runsc: refused (google/gvisor#13303)
        profile = kube.SECCOMP_PROFILE_GVISOR if gvisor else kube.SECCOMP_PROFILE
        assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": profile}, case
        assert container["resources"]["limits"] == container["resources"]["requests"], case
        for volume in spec["volumes"]:
            source = {k: v for k, v in volume.items() if k != "name"}
            assert list(source) in (["emptyDir"], ["persistentVolumeClaim"]), case
            assert source.get("emptyDir", {}).get("medium", "Memory") == "Memory", case
            assert source.get("persistentVolumeClaim", {}).get("readOnly", True) is True, case


def test_the_run_pod_matches_the_policy_and_the_docker_container() -> None:
    """The worker's stdio is attachable (stdin, stdinOnce, no TTY); limits, scratch and deadline come from
    the policy; the env carries the same reserved names and values as Docker's; labels and annotations are
    Docker's labels (those that are label values as labels, all verbatim as annotations)."""
    for policy in policies():
        for case, run, where, extra in runs(policy):
            pod = kube.sandbox_pod(policy, run, where, **extra)
            (c,) = pod["spec"]["containers"]
            assert (c["stdin"], c["stdinOnce"], c["tty"], c["workingDir"]) == (True, True, False, contract.SCRATCH)
            assert pod["spec"]["activeDeadlineSeconds"] == math.ceil(policy.timeouts.run_s + contract.GRACE_S)
            docker = container_config(policy, replace(run, extra_env={}))
            assert c["resources"]["limits"]["memory"] == _mib(docker["HostConfig"]["Memory"]), case
            assert c["resources"]["limits"]["cpu"] in (str(policy.limits.cpus).removesuffix(".0"),
                                                       f"{round(policy.limits.cpus * 1000)}m")  # fmt: skip
            scratch = next(v for v in pod["spec"]["volumes"] if v["name"] == "scratch")
            assert scratch["emptyDir"] == {"medium": "Memory", "sizeLimit": _mib(policy.limits.scratch)}
            env = {e["name"]: e["value"] for e in c["env"]}
            docker_env = dict(e.split("=", 1) for e in docker["Env"])
            assert {k: v for k, v in docker_env.items() if k.startswith("TOOLCAGE_")} == {
                k: v for k, v in env.items() if k.startswith("TOOLCAGE_") and k != contract.ENV_PROXY
            }, case
            assert pod["metadata"]["annotations"] == labels(policy, run), case
            selectable = pod["metadata"]["labels"]
            assert selectable[LABEL_RUN_ID] == run.run_id and selectable[LABEL_ROLE] == "sandbox", case
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            if "workspace_claim" in extra:
                rro = {} if run.runtime == GVISOR else {"recursiveReadOnly": "Enabled"}
                want = {"name": "workspace", "mountPath": contract.WORKSPACE, "readOnly": True, **rro}
                assert mounts[contract.WORKSPACE] == want, case
            elif run.workspace_copy:
                assert mounts[contract.WORKSPACE].get("readOnly") is None and env[contract.ENV_WORKSPACE_COPY] == "1"
            else:
                assert contract.WORKSPACE not in mounts


def _mib(size: int) -> str:
    return f"{size // 1024**2}Mi" if size % 1024**2 == 0 else f"{size // 1024}Ki"


def test_gvisor_pods_name_the_runtime_class_and_take_its_knobs() -> None:
    """Under gVisor the Pod names the RuntimeClass (handler runsc), takes the gVisor seccomp variant and the
    sentry's memory headroom, tool namespaces, and a read-only /tmp over runsc's own; runc Pods name none."""
    policy = load_policy("connector-http")
    run = run_spec(runtime=GVISOR, proxy_runtime=GVISOR)
    rc = kube.runtime_class(GVISOR)
    assert rc["handler"] == GVISOR.name == "runsc" and rc["metadata"]["name"] == GVISOR_AT.runtime_class
    sandbox = kube.sandbox_pod(policy, run, GVISOR_AT, proxy_address=PROXY_IP)
    for pod in (sandbox, kube.proxy_pod(policy, run, GVISOR_AT)):
        assert pod["spec"]["runtimeClassName"] == "gvisor"
        (c,) = pod["spec"]["containers"]
        assert {"name": contract.ENV_TOOL_NAMESPACES, "value": "1"} in c["env"]
        assert {m["mountPath"]: m.get("readOnly") for m in c["volumeMounts"]}["/tmp"] is True
    plain = kube.sandbox_pod(policy, run_spec(), RUNC_AT, proxy_address=PROXY_IP)
    assert "runtimeClassName" not in plain["spec"]
    with pytest.raises(ValueError, match="needs a RuntimeClass"):
        kube.sandbox_pod(policy, run, RUNC_AT, proxy_address=PROXY_IP)
    with pytest.raises(ValueError, match="no RuntimeClass"):
        kube.runtime_class(RUNC)


def test_the_proxy_pod_is_dockers_proxy_on_tcp() -> None:
    """The egress proxy runs Docker's proxy command and limits, listens on PROXY_PORT over TCP, has no stdin,
    and resolves names through the cluster's DNS (the run Pod has none)."""
    policy = load_policy("connector-http")
    run = run_spec()
    pod = kube.proxy_pod(policy, run, RUNC_AT, OWNER)
    docker = proxy_container_config(policy, replace(run, proxy_volume="v"), "net", None)
    (c,) = pod["spec"]["containers"]
    assert c["command"] == docker["Entrypoint"] and c["stdin"] is False
    assert c["resources"]["limits"] == {"cpu": "500m", "memory": _mib(docker["HostConfig"]["Memory"])}
    assert {"name": contract.ENV_PROXY_LISTEN, "value": f"0.0.0.0:{contract.PROXY_PORT}"} in c["env"]
    assert pod["spec"]["dnsPolicy"] == "ClusterFirst" and "dnsConfig" not in pod["spec"]
    sandbox = kube.sandbox_pod(policy, run, RUNC_AT, proxy_address=PROXY_IP)
    assert sandbox["spec"]["dnsConfig"] == {"nameservers": ["127.0.0.1"]}
    env = {e["name"]: e["value"] for e in sandbox["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_PROXY] == f"{PROXY_IP}:{contract.PROXY_PORT}" and contract.ENV_PROXY_SOCKET not in env
    svc = kube.proxy_service(policy, run, RUNC_AT)
    assert svc["spec"]["selector"] == {LABEL_RUN_ID: run.run_id, LABEL_ROLE: "egress-proxy"}
    assert pod["metadata"]["labels"].items() >= svc["spec"]["selector"].items()


# -- the network ----------------------------------------------------------------------------------------
def egress_of(pod: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The egress rules of every NetworkPolicy that selects ``pod`` (None: none selects it, so all is open)."""
    rules: list[dict[str, Any]] = []
    selected = False
    for np in objects:
        if np["kind"] == "NetworkPolicy" and _selects(np["spec"]["podSelector"], pod["metadata"].get("labels", {})):
            selected = selected or "Egress" in np["spec"]["policyTypes"]
            rules += np["spec"].get("egress", [])
    return rules if selected else None


def _selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    exists = all(e["key"] in pod_labels for e in selector.get("matchExpressions", []) if e["operator"] == "Exists")
    assert all(e["operator"] == "Exists" for e in selector.get("matchExpressions", []))
    return exists and selector.get("matchLabels", {}).items() <= pod_labels.items()


def test_the_run_pod_reaches_only_its_proxy() -> None:
    """With the namespace's baseline and the run's own policies together: a network-none run Pod may send
    nothing; a proxy run Pod only TCP to PROXY_PORT of its own proxy Pod (no DNS, no address block); no
    ingress to it at all."""
    for policy in policies():
        for case, run, where, extra in runs(policy):
            objects = [kube.baseline_network_policy(where), *kube.run_manifests(policy, run, where, **extra)]
            sandbox = next(o for o in objects if o["metadata"]["name"] == kube.pod_name(run))
            rules = egress_of(sandbox, objects)
            assert rules is not None, case
            if policy.network.mode == "none":
                assert rules == [], case
                continue
            proxy = next(o for o in objects if o["kind"] == "Pod" and o is not sandbox)
            assert proxy["metadata"]["name"] == kube.proxy_name(run), case
            for rule in rules:
                assert rule["ports"] == [{"protocol": "TCP", "port": contract.PROXY_PORT}], case
                for peer in rule["to"]:
                    assert list(peer) == ["podSelector"], case
                    assert _selects(peer["podSelector"], proxy["metadata"]["labels"]), case
                    assert not _selects(peer["podSelector"], sandbox["metadata"]["labels"]), case
            for np in objects:
                if np["kind"] == "NetworkPolicy" and _selects(np["spec"]["podSelector"], sandbox["metadata"]["labels"]):
                    assert np["spec"].get("ingress", []) == [], case


def test_the_check_of_the_run_pods_network_can_fail() -> None:
    """The check itself: a policy opening the sandbox to the world, or to DNS, is seen."""
    policy = load_policy("connector-http")
    objects = kube.run_manifests(policy, run_spec(), RUNC_AT, proxy_address=PROXY_IP)
    sandbox, open_np = objects[1], copy.deepcopy(objects[2])
    assert sandbox["kind"] == "Pod" and open_np["kind"] == "NetworkPolicy"
    open_np["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]})
    peers = [p for r in egress_of(sandbox, [open_np]) or [] for p in r["to"]]
    assert any(list(p) != ["podSelector"] for p in peers)
    assert egress_of(sandbox, []) is None  # no policy selects it: Kubernetes allows everything


def test_the_proxy_reaches_only_the_allowlists_ports_on_public_addresses() -> None:
    """The proxy Pod: ingress only from its run Pod; egress only to the allowlist's ports on addresses
    outside every range the proxy itself refuses (cloud metadata among them), the policy's own private
    ranges, and the cluster DNS on 53 only when an allowed host is a name."""
    metadata = ipaddress.ip_address("169.254.169.254")
    for net in [*map(ipaddress.ip_network, kube.DENY_V4), *map(ipaddress.ip_network, kube.DENY_V6)]:
        for address in (net.network_address, net.broadcast_address):
            assert address_problem(address) is not None, net  # never refuses what the proxy would allow
    assert any(metadata in ipaddress.ip_network(n) for n in kube.DENY_V4)
    dns = [[{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]]
    for policy, ports in ((load_policy("connector-http"), [443]), (WIDE, [80, 443, 8443])):
        np = kube.proxy_network_policy(policy, run_spec(), RUNC_AT)
        (ingress,) = np["spec"]["ingress"]
        assert ingress["from"] == [{"podSelector": {"matchLabels": {LABEL_RUN_ID: "abcd1234", LABEL_ROLE: "sandbox"}}}]
        web, *rest = np["spec"]["egress"]
        assert [p["port"] for p in web["ports"]] == ports and {p["protocol"] for p in web["ports"]} == {"TCP"}
        cidrs = [p["ipBlock"]["cidr"] for p in web["to"]]
        assert cidrs == ["0.0.0.0/0", "::/0", *policy.network.allow_private_cidrs]
        assert [r["ports"] for r in rest] == dns
    literal = Policy(name="lit", network=NetworkPolicy(mode="proxy", allow=(AllowRule(host="203.0.114.9"),)))
    assert len(kube.proxy_network_policy(literal, run_spec(), RUNC_AT)["spec"]["egress"]) == 1  # no DNS needed
    nothing = Policy(name="shut", network=NetworkPolicy(mode="proxy"))
    assert kube.proxy_network_policy(nothing, run_spec(), RUNC_AT)["spec"]["egress"] == []


# -- lifecycle ----------------------------------------------------------------------------------------
def test_a_runs_objects_come_in_order_and_name_the_run_pod_as_owner() -> None:
    """run_manifests: the proxy Service first (its ClusterIP goes into the run Pod), then the run Pod, then
    its dependents; every other object names the run Pod as owner (removed with it); all carry the run's labels."""
    policy = load_policy("connector-http")
    objects = kube.run_manifests(policy, run_spec(), RUNC_AT, proxy_address=PROXY_IP, owner=OWNER)
    assert [o["kind"] for o in objects] == ["Service", "Pod", "NetworkPolicy", "NetworkPolicy", "Pod"]
    run_pod = objects.pop(1)
    dependents = objects
    assert "ownerReferences" not in run_pod["metadata"]
    for o in dependents:
        assert o["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", **vars(OWNER)}]
    for o in [run_pod, *dependents]:
        assert o["metadata"]["labels"][LABEL_RUN_ID] == "abcd1234"
        assert kube.run_selector("abcd1234") == f"{LABEL_RUN_ID}=abcd1234"
    with pytest.raises(ValueError, match="proxy_address"):
        kube.sandbox_pod(load_policy("connector-http"), run_spec(), RUNC_AT)
    with pytest.raises(ValueError, match="host paths"):
        kube.sandbox_pod(load_policy("default"), run_spec(workspace=Path("/srv/repo")), RUNC_AT)


def test_attach_opens_the_workers_stdio_without_a_tty() -> None:
    """The runner attaches to the worker's stdin, stdout and stderr (no TTY), and to the proxy's stdout only."""
    path = kube.attach_path("toolcage", "toolcage-run-python-abcd1234")
    assert path == (
        "/api/v1/namespaces/toolcage/pods/toolcage-run-python-abcd1234/attach"
        "?container=worker&stdin=true&stdout=true&stderr=true&tty=false"
    )
    assert "stdin=false" in kube.attach_path("toolcage", "p", kube.PROXY, stdin=False)
    assert kube.ATTACH_PROTOCOLS[0] == "v5.channel.k8s.io"


def test_warm_pools_hand_out_a_deny_all_pod_once_and_delete_it_at_the_deadline() -> None:
    """The template: deny-all network, no env a claim could add, no per-run values (the run id is the Pod's
    own name, the deadline comes over the protocol); its Pod dies after idle + run + grace. The claim:
    deleted with its Sandbox and Pod at the run's deadline + grace, the run's labels as annotations."""
    policy = load_policy("default")
    t = kube.sandbox_template(policy, "p1", "toolcage-worker:test", RUNC_AT, idle_s=300)["spec"]
    assert t["networkPolicy"] == {} and t["networkPolicyManagement"] == "Managed"
    assert t["envVarsInjectionPolicy"] == t["volumeClaimTemplatesPolicy"] == "Disallowed" and t["service"] is False
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in t["podTemplate"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_POOLED] == "1" and contract.ENV_DEADLINE not in env
    assert env[contract.ENV_RUN_ID] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert t["podTemplate"]["metadata"]["labels"][LABEL_POOL] == "p1"
    assert t["podTemplate"]["spec"]["activeDeadlineSeconds"] == math.ceil(300 + 60 + 10 + contract.GRACE_S)
    with pytest.raises(ValueError, match="cold"):
        kube.sandbox_template(load_policy("connector-http"), "p1", "toolcage-worker:test", RUNC_AT)
    run = run_spec(deadline=1_800_000_000.2)
    claim = kube.sandbox_claim(policy, run, "p1", RUNC_AT)
    spec = claim["spec"]
    assert spec["warmPoolRef"] == {"name": "toolcage-pool-p1"} and "env" not in spec
    stop = datetime.strptime(spec["lifecycle"]["shutdownTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert stop.timestamp() == math.ceil(run.deadline + contract.GRACE_S)
    assert spec["lifecycle"]["shutdownPolicy"] == "Delete"
    assert "labels" not in spec["additionalPodMetadata"]  # the controller admits claim labels only in allowed domains
    assert spec["additionalPodMetadata"]["annotations"][LABEL_RUN_ID] == run.run_id
    assert all("/" not in k for k in spec["additionalPodMetadata"]["annotations"])
    assert claim["metadata"]["labels"][LABEL_POOL] == "p1"
    assert kube.warm_pool("p1", 4, RUNC_AT)["spec"]["updateStrategy"] == {"type": "Recreate"}


def test_the_vendored_crds_name_their_source() -> None:
    """The vendored schemas say where they come from (repository, commit, files) and are the storage version."""
    assert CRDS["source"] == "https://github.com/kubernetes-sigs/agent-sandbox"
    assert re.fullmatch(r"[0-9a-f]{40}", CRDS["commit"])
    assert set(CRDS["schemas"]) == set(CRDS["files"]) == {"SandboxTemplate", "SandboxWarmPool", "SandboxClaim"}
