"""The Kubernetes backend on paper: every object a run would create, rendered as API dicts from the policy.

Pure functions, no client and no API server (none can run where toolcage is built): unit tests check each
manifest against the published schemas. docs/kubernetes.md is the design; this module is its letter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from toolcage.engine.hostconfig import PROXY_RESOURCES
from toolcage.engine.knobs import RUNC, RuntimeKnobs, gvisor_memory_headroom
from toolcage.engine.labels import (
    LABEL_KEEP,
    LABEL_POLICY,
    LABEL_POLICY_SHA256,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_RUN_ID,
    LABEL_TOOL,
    NAME_PREFIX,
    RunSpec,
    labels,
)
from toolcage.policies import Limits, Policy, contract
from toolcage.policies.names import ip_literal

ROLE_SANDBOX, ROLE_PROXY = "sandbox", "egress-proxy"  # LABEL_ROLE's values, as on Docker
WORKER, PROXY = "worker", "egress-proxy"  # container names in the two Pods
# toolcage's seccomp profiles, installed on each node under the kubelet's seccomp root
# (`python -m toolcage.engine.seccomp`): Localhost profiles are node files, not API objects
SECCOMP_PROFILE, SECCOMP_PROFILE_GVISOR = "toolcage/seccomp.json", "toolcage/seccomp-gvisor.json"
AGENT_SANDBOX_API = "extensions.agents.x-k8s.io/v1beta1"  # v1alpha1 is deprecated at agent-sandbox@2fd412d
CLUSTER_DNS = {"namespace": "kube-system", "k8s-app": "kube-dns"}  # where the egress proxy resolves names
# The egress proxy's own floor (the proxy checks every resolved address with policies.addresses; this is
# the CNI's second layer): the cluster's own networks, loopback, link-local (cloud metadata), multicast.
DENY_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
           "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4")  # fmt: skip
DENY_V6 = ("::1/128", "64:ff9b::/96", "2001::/32", "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8")
# v5 can close stdin alone (kubernetes/kubernetes#89899: v4 cannot), so the worker sees EOF while its
# last answers still come back; servers before 1.30 speak v4 only
ATTACH_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Placement:
    """Where a run's objects go and what the cluster gives them; the same for many runs."""

    namespace: str = NAME_PREFIX
    # the RuntimeClass (runtime_class()) a Pod gets when its runtime is not runc, the cluster's default:
    # "gvisor" for GVISOR's knobs. A runc Pod names none.
    runtime_class: str | None = None
    # hostUsers: false for runc Pods, their own user namespace (mitigates the 2025 runc masked-path escapes;
    # needs Linux 6.3+ and a workspace filesystem with idmapped mounts: NFS has none). gVisor Pods never:
    # the kubelet refuses it for runsc, which advertises no user-namespace support (google/gvisor#13303)
    user_namespace: bool = True


@dataclass(frozen=True)
class OwnerRef:
    """The run Pod, once created: its dependents name it so the garbage collector removes them with it."""

    name: str
    uid: str


def pod_name(run: RunSpec) -> str:
    """The run Pod's name: Docker's container name in DNS form (no '_', no capitals)."""
    safe = re.sub(r"[^a-z0-9-]", "-", run.tool.lower())[:40].strip("-") or "run"
    return f"{NAME_PREFIX}-{safe}-{_dns(run.run_id, 'run_id')}"


def proxy_name(run: RunSpec) -> str:
    """The egress proxy's Pod and Service (a DNS-1035 label: it starts with a letter)."""
    return f"{NAME_PREFIX}-{_dns(run.run_id, 'run_id')}-egress"


def label_value(text: str) -> str:
    """``text`` as a valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")


def run_selector(run_id: str) -> str:
    """The label selector of every object of one run (list, watch, delete_collection)."""
    return f"{LABEL_RUN_ID}={_dns(run_id, 'run_id')}"


def attach_path(ns: str, pod: str, container: str = WORKER, stdin: bool = True) -> str:
    """The attach subresource the runner opens (a WebSocket, ``ATTACH_PROTOCOLS``): the worker's stdio, or
    (stdin False) the egress proxy's decisions on its stdout."""
    query = {"container": container, "stdin": stdin, "stdout": True, "stderr": True, "tty": False}
    flags = urlencode({k: str(v).lower() for k, v in query.items()})
    return f"/api/v1/namespaces/{ns}/pods/{pod}/attach?{flags}"


# -- the run -------------------------------------------------------------------------------------
def sandbox_pod(
    policy: Policy,
    run: RunSpec,
    where: Placement,
    *,
    proxy_address: str | None = None,
    workspace_claim: str | None = None,
) -> Manifest:
    """The run Pod: the worker as PID 1, its stdio attached, hardened as the Docker backend's container.

    ``proxy_address``: the egress proxy Service's ClusterIP (network.mode proxy), so the Pod needs no DNS.
    ``workspace_claim``: a PersistentVolumeClaim holding the workspace, mounted read-only at WORKSPACE."""
    if run.workspace is not None or run.tool_mounts or run.proxy_volume is not None:
        raise ValueError("host paths and volumes of the Docker engine cannot reach a cluster's node")
    if (policy.network.mode == "proxy") != (proxy_address is not None):
        raise ValueError("proxy_address is the egress proxy's ClusterIP: given exactly when network.mode is proxy")
    env = {
        **run.extra_env,
        contract.ENV_POLICY: policy.canonical_json(),
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_DEADLINE: f"{run.deadline:.3f}",
        contract.ENV_IN_CONTAINER: "1",
        contract.ENV_WATCH_RUNNER: "1",
    }
    if proxy_address is not None:  # no relay, no socket: the proxy is a TCP peer the NetworkPolicy allows
        url = f"http://{proxy_address}:{contract.PROXY_PORT}"
        env |= {contract.ENV_PROXY: f"{proxy_address}:{contract.PROXY_PORT}", "HTTP_PROXY": url}
        env |= {"HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": "", "no_proxy": ""}
    spec = _pod_spec(
        policy.limits, run.image, run.runtime, where, env, _deadline_s(policy.timeouts.run_s), run.entrypoint
    )
    _mount_workspace(spec, policy, run.runtime, workspace_claim, run.workspace_copy)
    return _object("v1", "Pod", pod_name(run), where, _run_meta(policy, run, ROLE_SANDBOX), spec)


def proxy_pod(policy: Policy, run: RunSpec, where: Placement, owner: OwnerRef | None = None) -> Manifest:
    """The run's egress proxy: the same image and hardening, its own small limits, no stdin; listens on TCP."""
    from toolcage.backends.egress import STOP_GRACE_S

    env = {
        contract.ENV_POLICY: policy.canonical_json(),
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_DEADLINE: f"{run.deadline:.3f}",
        contract.ENV_PROXY_LISTEN: f"0.0.0.0:{contract.PROXY_PORT}",
    }
    command = ("python3", "-S", "-m", "toolcage.worker.egress.proxy")  # as hostconfig.proxy_container_config
    p = PROXY_RESOURCES  # one process serving one sandbox's connections
    lim = replace(policy.limits, pids=p.pids, memory=p.memory, cpus=p.nano_cpus / 1e9)
    spec = _pod_spec(lim, run.image, run.proxy_runtime, where, env, _deadline_s(policy.timeouts.run_s), command)
    spec["containers"][0].update(name=PROXY, stdin=False, stdinOnce=False)
    spec["containers"][0]["ports"] = [{"name": "proxy", "containerPort": contract.PROXY_PORT, "protocol": "TCP"}]
    spec.pop("dnsConfig")
    spec.update(dnsPolicy="ClusterFirst", terminationGracePeriodSeconds=math.ceil(STOP_GRACE_S))
    return _object("v1", "Pod", proxy_name(run), where, _run_meta(policy, run, ROLE_PROXY, owner), spec)


def proxy_service(policy: Policy, run: RunSpec, where: Placement, owner: OwnerRef | None = None) -> Manifest:
    """A stable ClusterIP for the proxy, known before either Pod is scheduled, so both start at once."""
    spec = {
        "type": "ClusterIP",
        "selector": {LABEL_RUN_ID: run.run_id, LABEL_ROLE: ROLE_PROXY},
        "ports": [{"name": "proxy", "protocol": "TCP", "port": contract.PROXY_PORT, "targetPort": "proxy"}],
    }
    return _object("v1", "Service", proxy_name(run), where, _run_meta(policy, run, ROLE_PROXY, owner), spec)


def sandbox_network_policy(policy: Policy, run: RunSpec, where: Placement, owner: OwnerRef | None = None) -> Manifest:
    """The run Pod talks to nothing: no ingress (stdio goes through the kubelet, not the pod network), and
    egress only to its own proxy's port under network.mode proxy. No DNS: the proxy resolves names."""
    egress = []
    if policy.network.mode == "proxy":
        proxy = {"podSelector": {"matchLabels": {LABEL_RUN_ID: run.run_id, LABEL_ROLE: ROLE_PROXY}}}
        egress.append({"to": [proxy], "ports": [{"protocol": "TCP", "port": contract.PROXY_PORT}]})
    spec = {
        "podSelector": {"matchLabels": {LABEL_RUN_ID: run.run_id, LABEL_ROLE: ROLE_SANDBOX}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": egress,
    }
    meta = _run_meta(policy, run, ROLE_SANDBOX, owner)
    return _object("networking.k8s.io/v1", "NetworkPolicy", pod_name(run), where, meta, spec)


def proxy_network_policy(policy: Policy, run: RunSpec, where: Placement, owner: OwnerRef | None = None) -> Manifest:
    """The proxy: in from its run's Pod only; out to the allowlist's ports on public addresses (and the
    policy's allow_private_cidrs), and to the cluster's DNS when some allowed host is a name."""
    net = policy.network
    ports = sorted({p for r in net.allow for s in r.schemes for p in r.allowed_ports(s)})
    egress: list[dict[str, Any]] = []
    if ports:
        peers = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(DENY_V4)}},
                 {"ipBlock": {"cidr": "::/0", "except": list(DENY_V6)}}]  # fmt: skip
        peers += [{"ipBlock": {"cidr": cidr}} for cidr in net.allow_private_cidrs]
        egress.append({"to": peers, "ports": [{"protocol": "TCP", "port": p} for p in ports]})
    if ports and any(ip_literal(r.host.removeprefix("*.")) is None for r in net.allow):
        ns = {"matchLabels": {"kubernetes.io/metadata.name": CLUSTER_DNS["namespace"]}}
        dns = {"namespaceSelector": ns, "podSelector": {"matchLabels": {"k8s-app": CLUSTER_DNS["k8s-app"]}}}
        egress.append({"to": [dns], "ports": [{"protocol": p, "port": 53} for p in ("UDP", "TCP")]})
    sandbox = {"podSelector": {"matchLabels": {LABEL_RUN_ID: run.run_id, LABEL_ROLE: ROLE_SANDBOX}}}
    spec = {
        "podSelector": {"matchLabels": {LABEL_RUN_ID: run.run_id, LABEL_ROLE: ROLE_PROXY}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [sandbox], "ports": [{"protocol": "TCP", "port": contract.PROXY_PORT}]}],
        "egress": egress,
    }
    meta = _run_meta(policy, run, ROLE_PROXY, owner)
    return _object("networking.k8s.io/v1", "NetworkPolicy", proxy_name(run), where, meta, spec)


def run_manifests(
    policy: Policy, run: RunSpec, where: Placement, *, proxy_address: str | None = None,
    workspace_claim: str | None = None, owner: OwnerRef | None = None,
) -> list[Manifest]:  # fmt: skip
    """Every object of one run, in the order the runner creates them (docs/kubernetes.md, "One run"): the
    proxy's Service (its ClusterIP goes into the run Pod), the run Pod, then what names it as ``owner``
    (the Service too, by a patch once the Pod exists). The namespace's baseline denies all meanwhile."""
    proxied = policy.network.mode == "proxy"
    out = [proxy_service(policy, run, where, owner)] if proxied else []
    out += [sandbox_pod(policy, run, where, proxy_address=proxy_address, workspace_claim=workspace_claim)]
    out += [sandbox_network_policy(policy, run, where, owner)]
    if proxied:
        out += [proxy_network_policy(policy, run, where, owner), proxy_pod(policy, run, where, owner)]
    return out


# -- once per cluster or namespace ----------------------------------------------------------------
def namespace(where: Placement) -> Manifest:
    """The sandboxes' namespace, held to the Pod Security Standard "restricted" by admission."""
    psa = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "audit", "warn")}
    meta = {"name": _dns(where.namespace, "namespace"), "labels": psa}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def baseline_network_policy(where: Placement) -> Manifest:
    """Deny everything to every toolcage Pod of the namespace from the moment it exists: a run's own
    policies (made after its Pod, to name it as owner) and a warm pool's only ever add to this."""
    spec = {
        "podSelector": {"matchExpressions": [{"key": LABEL_ROLE, "operator": "Exists"}]},
        "policyTypes": ["Ingress", "Egress"],
    }
    return _object("networking.k8s.io/v1", "NetworkPolicy", f"{NAME_PREFIX}-deny-all", where, {}, spec)


def runtime_class(runtime: RuntimeKnobs, name: str = "gvisor", node_selector: dict[str, str] | None = None) -> Manifest:
    """The RuntimeClass for ``runtime``'s handler (GVISOR: runsc, configured on the nodes with
    --oci-seccomp as .ci/register-runsc does for Docker)."""
    if runtime.name is None:
        raise ValueError("runc is the cluster's default handler: it needs no RuntimeClass")
    out: Manifest = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                     "handler": runtime.name}  # fmt: skip
    if node_selector:
        out["scheduling"] = {"nodeSelector": dict(node_selector)}
    return out


# -- agent-sandbox warm pools (kubernetes-sigs/agent-sandbox) -----------------------------------------
def sandbox_template(
    policy: Policy, pool: str, image: str, where: Placement, *, runtime: RuntimeKnobs = RUNC,
    workspace_claim: str | None = None, idle_s: float | None = None,
) -> Manifest:  # fmt: skip
    """A warm pool's Pod, made before its run exists: the run's id, deadline and secrets come over the
    protocol at adoption (sandbox.configure), never as env (a claim with env is forced to a cold start)."""
    from toolcage.engine.labels import SLOT_GRACE_S

    if policy.network.mode != "none":
        raise ValueError("a warm Pod cannot know its run's egress proxy: network.mode proxy runs cold")
    env: dict[str, Any] = {
        contract.ENV_POLICY: policy.canonical_json(),
        contract.ENV_RUN_ID: {"fieldRef": {"fieldPath": "metadata.name"}},  # each slot its own id
        contract.ENV_IN_CONTAINER: "1",
        contract.ENV_WATCH_RUNNER: "1",
        contract.ENV_POOLED: "1",
    }
    life = (policy.timeouts.idle_s if idle_s is None else idle_s) + policy.timeouts.run_s + SLOT_GRACE_S
    spec = _pod_spec(policy.limits, image, runtime, where, env, _deadline_s(life), ())
    _mount_workspace(spec, policy, runtime, workspace_claim, False)
    pod_labels = {LABEL_ROLE: ROLE_SANDBOX, LABEL_POOL: _dns(pool, "pool"), LABEL_POLICY: label_value(policy.name)}
    pod_meta = {"labels": pod_labels, "annotations": {LABEL_POLICY: policy.name, LABEL_POLICY_SHA256: policy.sha256()}}
    body = {
        "podTemplate": {"metadata": pod_meta, "spec": spec},
        "networkPolicyManagement": "Managed",
        "networkPolicy": {},  # empty rules: the controller's shared policy denies all ingress and egress
        "envVarsInjectionPolicy": "Disallowed",
        "volumeClaimTemplatesPolicy": "Disallowed",
        "service": False,  # nothing listens: the runner attaches through the API
    }
    meta = {"labels": {LABEL_POOL: pool, LABEL_POLICY: label_value(policy.name)}}
    return _object(AGENT_SANDBOX_API, "SandboxTemplate", _pool_name(pool), where, meta, body)


def warm_pool(pool: str, replicas: int, where: Placement) -> Manifest:
    """The pool: ``replicas`` started slots; Recreate replaces unclaimed ones at once when the template
    (its policy) changes, so no slot of an old policy is handed out."""
    body = {"replicas": replicas, "sandboxTemplateRef": {"name": _pool_name(pool)},
            "updateStrategy": {"type": "Recreate"}}  # fmt: skip
    return _object(AGENT_SANDBOX_API, "SandboxWarmPool", _pool_name(pool), where, {"labels": {LABEL_POOL: pool}}, body)


def sandbox_claim(policy: Policy, run: RunSpec, pool: str, where: Placement) -> Manifest:
    """One run's claim on one warm slot: the controller deletes claim, Sandbox and Pod at the deadline
    (shutdownPolicy Delete), and a slot is claimed once, so it is never handed to a second run. The
    run's labels ride as annotations: the controller lets a claim add labels only in allowed domains."""
    stop = datetime.fromtimestamp(math.ceil(run.deadline + contract.GRACE_S), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = _run_meta(policy, replace(run, pool=pool), ROLE_SANDBOX)
    body = {
        "warmPoolRef": {"name": _pool_name(pool)},
        "lifecycle": {"shutdownTime": stop, "shutdownPolicy": "Delete"},
        "additionalPodMetadata": {"annotations": meta["annotations"]},
    }
    return _object(AGENT_SANDBOX_API, "SandboxClaim", pod_name(run), where, meta, body)


# -- shared ------------------------------------------------------------------------------------------
def _pod_spec(
    lim: Limits, image: str, runtime: RuntimeKnobs, where: Placement, env: dict[str, Any], deadline_s: int,
    command: tuple[str, ...],
) -> dict[str, Any]:  # fmt: skip
    memory = lim.memory + (gvisor_memory_headroom(lim.pids) if runtime.memory_headroom else 0)
    if runtime.tool_namespaces:
        env = {**env, contract.ENV_TOOL_NAMESPACES: "1"}
    if runtime.name is not None and where.runtime_class is None:
        raise ValueError(f"runtime {runtime.name} needs a RuntimeClass (Placement.runtime_class)")
    profile = SECCOMP_PROFILE_GVISOR if runtime.seccomp_gvisor else SECCOMP_PROFILE
    millis = max(1, round(lim.cpus * 1000))
    resources = {"cpu": f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m", "memory": _quantity(memory)}
    container: dict[str, Any] = {
        "name": WORKER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": contract.SCRATCH,
        "env": [{"name": k, "value": v} if isinstance(v, str) else {"name": k, "valueFrom": v} for k, v in env.items()],
        "stdin": True,
        "stdinOnce": True,  # the first attach ending closes stdin: the worker sees EOF and exits
        "tty": False,
        "resources": {"limits": resources, "requests": dict(resources)},  # Guaranteed: last to be evicted
        "securityContext": {
            "runAsUser": contract.SANDBOX_UID,
            "runAsGroup": contract.SANDBOX_UID,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,  # tool code cannot alter the image or plant files
            "allowPrivilegeEscalation": False,  # no-new-privileges: setuid and file caps raise nothing
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "Localhost", "localhostProfile": profile},
        },
        "volumeMounts": [{"name": "scratch", "mountPath": contract.SCRATCH}],
    }
    if command:
        container["command"] = list(command)
    volumes: list[dict[str, Any]] = [
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(lim.scratch)}}
    ]
    for i, path in enumerate(runtime.readonly_tmp):  # runsc's own writable /tmp, covered by an empty read-only one
        volumes.append({"name": f"ro-tmp-{i}", "emptyDir": {"medium": "Memory", "sizeLimit": "4Ki"}})
        container["volumeMounts"].append({"name": f"ro-tmp-{i}", "mountPath": path, "readOnly": True})
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_s,  # the kubelet kills the Pod then, whoever else is gone
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,  # no token: tool code cannot call the API server
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables naming the namespace's Services
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,  # the worker is PID 1, as on Docker
        "hostname": NAME_PREFIX,
        # resolv.conf names loopback only: a lookup fails at once (not a 5 s timeout against the
        # NetworkPolicy) and the cluster's search domains are not shown
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": contract.SANDBOX_UID,
            "runAsGroup": contract.SANDBOX_UID,
        },
    }
    if where.user_namespace and runtime.name is None:
        spec["hostUsers"] = False
    if runtime.name is not None:
        spec["runtimeClassName"] = where.runtime_class
    return spec


def _mount_workspace(
    spec: dict[str, Any], policy: Policy, runtime: RuntimeKnobs, claim: str | None, copy: bool
) -> None:
    """WORKSPACE: a PersistentVolumeClaim read-only (under runc recursively: no writable submount; runsc
    advertises no recursive read-only mounts, so the kubelet would refuse them), or the run's writable
    copy in memory (workspace_mode copy, filled over the protocol), or nothing."""
    if claim is not None and copy:
        raise ValueError("workspace_mode copy mounts nothing of the caller's: no workspace_claim")
    container = spec["containers"][0]
    if claim is not None:
        spec["volumes"].append({"name": "workspace", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mount = {"name": "workspace", "mountPath": contract.WORKSPACE, "readOnly": True}
        if runtime.name is None:
            mount["recursiveReadOnly"] = "Enabled"
        container["volumeMounts"].append(mount)
    elif copy:
        size = _quantity(policy.limits.workspace_copy)
        spec["volumes"].append({"name": "workspace", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        container["volumeMounts"].append({"name": "workspace", "mountPath": contract.WORKSPACE})
        container["env"].append({"name": contract.ENV_WORKSPACE_COPY, "value": "1"})


def _run_meta(policy: Policy, run: RunSpec, role: str, owner: OwnerRef | None = None) -> dict[str, Any]:
    """Labels to select by (valid label values only), and Docker's labels verbatim as annotations: a
    sha256 or an ISO time is no label value, and the reaper reads the same keys from either."""
    exact = {**labels(policy, run), LABEL_ROLE: role}
    meta: dict[str, Any] = {
        "labels": {k: label_value(v) for k, v in exact.items() if k in _SELECT},
        "annotations": exact,
    }
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}]
    return meta


_SELECT = (LABEL_RUN_ID, LABEL_TOOL, LABEL_POLICY, LABEL_ROLE, LABEL_KEEP, LABEL_POOL)


def _object(api: str, kind: str, name: str, where: Placement, meta: dict[str, Any], body: dict[str, Any]) -> Manifest:
    metadata = {"name": name, "namespace": _dns(where.namespace, "namespace"), **meta}
    return {"apiVersion": api, "kind": kind, "metadata": metadata, "spec": body}


def _deadline_s(seconds: float) -> int:
    """activeDeadlineSeconds: the run's deadline plus the worker's grace, so the runner's kill comes first."""
    return math.ceil(seconds + contract.GRACE_S)


def _pool_name(pool: str) -> str:
    return f"{NAME_PREFIX}-pool-{_dns(pool, 'pool')}"


def _dns(text: str, what: str) -> str:
    if not _DNS_LABEL.fullmatch(text):
        raise ValueError(f"{what} {text!r} must be lower-case letters, digits and '-' (at most 40)")
    return text


def _quantity(size: int) -> str:
    for unit, factor in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


__all__ = [
    "AGENT_SANDBOX_API", "ATTACH_PROTOCOLS", "OwnerRef", "Placement", "attach_path", "baseline_network_policy",
    "label_value", "namespace", "pod_name", "proxy_name", "proxy_network_policy", "proxy_pod", "proxy_service",
    "run_manifests", "run_selector", "runtime_class", "sandbox_claim", "sandbox_network_policy", "sandbox_pod",
    "sandbox_template", "warm_pool",
]  # fmt: skip
