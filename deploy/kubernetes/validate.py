"""Check deploy/kubernetes/ offline, without a cluster: what ``kubectl apply -k`` would reject and
what would only fail once pods run. The base and every overlay are rendered (kustomize_render.py;
where kubectl is installed, ``kubectl kustomize`` must render the same), then:

- every object against the Kubernetes API schema of version :data:`KUBERNETES_VERSION` (strict:
  unknown fields are errors), from the schemas the kubernetes-validate package bundles;
- every ConfigMap, Secret (and key) and PersistentVolumeClaim a pod names is in the render, every
  volume mount names a volume or volume claim template of its pod, every volume is mounted,
  selectors match their pod templates, StatefulSets name a headless Service, Services select pods
  that listen on their target ports, extended resources (nvidia.com/gpu) request what they limit;
- environment variables resolve as the kubelet resolves them (``envFrom`` first, then ``env`` in
  order; ``$(NAME)`` only of a variable defined before it), and no ``$(NAME)`` is left unresolved;
- every learner/agent/eval command line, after compose/entrypoint.py's ``--id auto`` and
  ``--resume auto``, is one the CLI (``surreal_redis.cli:main``) accepts, its config loads with its
  overrides, all processes run one experiment, and agent pod ``agents-K`` runs ``--id K``;
- each process logs in as its run's ACL user with that user's password from the Secret, at an
  address that is the Redis Service (or, for redis+cluster://, pods of the Redis StatefulSet)
  and its port; the learner's MLflow URI is the MLflow Service, which lets that host in;
- the ACL file the Redis pod's init container writes (compose/acl_file.py) gives each user exactly
  the rules of ``surreal-redis acl --print-rules``, for the processes' run, where redis.conf's
  ``aclfile`` reads it;
- Redis's config file is mounted from its ConfigMap and has compose's settings (redis.conf, or
  redis-cluster.conf for cluster nodes), ``dir`` is on a persistent volume, and ``--maxmemory``
  is below the container's memory limit;
- the MLflow server's options are ones the installed MLflow accepts.

    python deploy/kubernetes/validate.py [--passwords FILE]   # exit 1 and one line per problem

Run it with the project's Python environment (it imports surreal_redis). Without
base/passwords.env (or --passwords), the Secret gets example passwords.
"""

from __future__ import annotations

import argparse
import base64
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import yaml

from surreal_redis.acl import ROLES
from surreal_redis.connection import CLUSTER_SCHEMES, parse_cluster_url

KUBERNETES_DIR = Path(__file__).resolve().parent
COMPOSE_DIR = KUBERNETES_DIR.parents[1] / "compose"
sys.path.insert(0, str(COMPOSE_DIR))  # entrypoint.py and acl_file.py, as the image has them
sys.path.append(str(KUBERNETES_DIR))  # kustomize_render.py; last, so that this validate.py shadows no other
from acl_file import ADMIN_VARIABLE, acl_file_text  # noqa: E402
from entrypoint import EntrypointError, command_index, complete  # noqa: E402
from kustomize_render import RenderError, name_references, render  # noqa: E402

# The schemas every object must pass: the oldest Kubernetes whose API has every field used here
# at GA (the apps.kubernetes.io/pod-index label that gives agents their ids: 1.32).
KUBERNETES_VERSION = "1.32.0"
TARGETS = ("base", "overlays/gpu", "overlays/more-agents", "overlays/redis-cluster")
PASSWORDS_FILE = "base/passwords.env"
IMAGE = "surreal-redis"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_MEMORY_UNITS = {"": 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}
_QUANTITY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20,
                   "Gi": 2**30, "Ti": 2**40}
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}


def _compose_validate() -> ModuleType:
    """compose/validate.py, under a name of its own (the tests import both validate.py files)."""
    spec = importlib.util.spec_from_file_location("compose_validate", COMPOSE_DIR / "validate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


compose_validate = _compose_validate()
EXAMPLE_PASSWORDS = compose_validate.EXAMPLE_PASSWORDS


# ---------------------------------------------------------------- what the kubelet does

def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes's ``$(NAME)`` expansion: a defined variable is replaced, ``$$`` is ``$``, anything
    else stays as written (so ``$(getent ...)`` reaches a shell unchanged)."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def unresolved(text: str, variables: Mapping[str, str]) -> list[str]:
    """The ``$(NAME)`` references in ``text`` that name no variable in ``variables``."""
    return [m.group(1) for m in _REFERENCE.finditer(text) if m.group(1) and m.group(1) not in variables]


@dataclass(frozen=True)
class Pod:
    """One pod of a workload, as the validator imagines it: its name and ordinal (StatefulSets)."""
    name: str
    ordinal: int | None
    labels: Mapping[str, str]


def replicas(obj: Mapping[str, Any]) -> int:
    """A workload's replica count (1 when it is not a whole number, which the schema reports)."""
    count = (obj.get("spec") or {}).get("replicas", 1)
    return count if isinstance(count, int) else 1


def sample_pods(obj: Mapping[str, Any]) -> list[Pod]:
    """The pods to check a workload with: a StatefulSet's first and last, else one."""
    template_labels = dict(((obj["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {})
    name = obj["metadata"]["name"]
    if obj["kind"] != "StatefulSet":
        return [Pod(f"{name}-7d9f8c6b5-x2x4q", None, template_labels)]
    start = (obj["spec"].get("ordinals") or {}).get("start", 0)
    last = start + max(replicas(obj) - 1, 0)
    return [Pod(f"{name}-{k}", k, {**template_labels, POD_INDEX_LABEL: str(k)}) for k in sorted({start, last})]


class Cluster:
    """The rendered objects, indexed for look-ups."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.by_kind: dict[str, dict[str, dict[str, Any]]] = {}
        for obj in objects:
            self.by_kind.setdefault(obj.get("kind", "?"), {})[(obj.get("metadata") or {}).get("name", "?")] = obj

    def config_map(self, name: str) -> dict[str, str] | None:
        obj = self.by_kind.get("ConfigMap", {}).get(name)
        return None if obj is None else dict(obj.get("data") or {})

    def secret(self, name: str) -> dict[str, str] | None:
        obj = self.by_kind.get("Secret", {}).get(name)
        if obj is None:
            return None
        values = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {**values, **(obj.get("stringData") or {})}

    def workloads(self) -> Iterable[dict[str, Any]]:
        for obj in self.objects:
            if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
                yield obj


def container_env(cluster: Cluster, container: Mapping[str, Any], pod: Pod,
                  problems: list[str], where: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom, then env in order)."""
    variables: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            values = cluster.config_map(source["configMapRef"]["name"])
        else:
            values = cluster.secret(source["secretRef"]["name"])
        variables.update({source.get("prefix", "") + k: v for k, v in (values or {}).items()})
    for env in container.get("env") or []:
        name = env["name"]
        if "value" in env:
            missing = unresolved(str(env["value"]), variables)
            if missing:
                problems.append(f"{where}: env {name} uses $({missing[0]}), which is not defined before it "
                                "(the kubelet leaves it as written)")
            variables[name] = expand(str(env["value"]), variables)
            continue
        source = env.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = (cluster.config_map(ref["name"]) or {}).get(ref["key"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = (cluster.secret(ref["name"]) or {}).get(ref["key"])
        elif "fieldRef" in source:
            value = _field(source["fieldRef"]["fieldPath"], pod)
        else:
            value = None
        if value is None:
            problems.append(f"{where}: env {name} has no value the validator can resolve ({source})")
            value = ""
        variables[name] = value
    return variables


def _field(path: str, pod: Pod) -> str | None:
    """A downward-API field of ``pod`` (the ones used here; the pod IP is an example address)."""
    label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if label:
        return pod.labels.get(label.group(1))
    return {"metadata.name": pod.name, "metadata.namespace": "default", "status.podIP": "10.0.0.10",
            "spec.nodeName": "node-1"}.get(path)


def container_command(container: Mapping[str, Any], variables: Mapping[str, str],
                      problems: list[str], where: str) -> tuple[list[str] | None, list[str]]:
    """The container's command and args with ``$(NAME)`` expanded (None: the image's entrypoint)."""
    expanded: list[list[str] | None] = []
    for part in ("command", "args"):
        items = container.get(part)
        if items is None:
            expanded.append(None)
            continue
        for item in items:
            for name in unresolved(str(item), variables):
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    problems.append(f"{where}: {part} uses $({name}), which is not an environment variable "
                                    "of the container")
        expanded.append([expand(str(item), variables) for item in items])
    return expanded[0], expanded[1] or []


# ---------------------------------------------------------------- units

def redis_bytes(text: str) -> int:
    """A Redis memory setting (``4gb``, ``100mb``, ``1g``: gb is 2**30, g is 10**9) in bytes."""
    match = re.fullmatch(r"(\d+)([a-zA-Z]*)", text.strip())
    if match is None or match.group(2).lower() not in _MEMORY_UNITS:
        raise ValueError(f"not a Redis memory size: {text!r}")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]


def quantity_bytes(text: str | int) -> int:
    """A Kubernetes quantity (``5Gi``, ``512Mi``, ``4G``) in bytes."""
    match = re.fullmatch(r"(\d+)([a-zA-Z]*)", str(text).strip())
    if match is None or match.group(2) not in _QUANTITY_UNITS:
        raise ValueError(f"not a Kubernetes memory quantity: {text!r}")
    return int(match.group(1)) * _QUANTITY_UNITS[match.group(2)]


# ---------------------------------------------------------------- the checks

@functools.cache
def _schema_file(path: str, version: str) -> Any:
    from kubernetes_validate.utils import schema_contents

    return schema_contents(path, version)


@functools.cache
def schema_validator(kind: str, api_version: str, version: str = KUBERNETES_VERSION) -> Any:
    """The strict JSON-schema validator kubernetes_validate.validate(..., strict=True) builds for
    ``kind`` in ``api_version``, built once (it rereads its schemas, megabytes, for every object).
    Raises FileNotFoundError when the version has no schema for the kind."""
    import jsonschema
    from referencing import Registry, Resource

    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = _schema_file(f"{folder}/{kind.lower()}-{group}.json", version)
    registry = Resource.from_contents(_schema_file(f"{folder}/_definitions.json", version)) @ (
        Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def schema_problems(objects: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> list[str]:
    """Every object against the strict API schema of Kubernetes ``version`` (all its errors)."""
    found = []
    for obj in objects:
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        try:
            validator = schema_validator(str(obj.get("kind")), str(obj.get("apiVersion")), version)
        except FileNotFoundError:
            found.append(f"{name}: Kubernetes {version} has no {obj.get('apiVersion')} {obj.get('kind')}")
            continue
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
            at = ".".join(str(p) for p in error.path) or "(top)"
            found.append(f"{name}: Kubernetes {version} schema: {at}: {error.message}")
    return found


def _pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def _containers(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]


def _image_repository(image: str) -> str:
    name = image.split("@", 1)[0]
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name


def is_surreal_image(image: str) -> bool:
    return _image_repository(image).rsplit("/", 1)[-1] == IMAGE


def reference_problems(cluster: Cluster, obj: Mapping[str, Any]) -> list[str]:
    """ConfigMaps, Secrets, keys, claims and volumes a workload names exist; its selector and Service fit."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    spec = obj.get("spec") or {}
    pod = _pod_spec(obj)
    found = []
    for kind, holder, key in name_references(pod):
        if (cluster.config_map if kind == "ConfigMap" else cluster.secret)(holder.get(key)) is None \
                and not holder.get("optional"):
            found.append(f"{where}: names {kind} {holder.get(key)!r}, which is not in the kustomization")
    for container in _containers(pod):
        for env in container.get("env") or []:
            source = env.get("valueFrom") or {}
            for ref_kind, lookup in (("configMapKeyRef", cluster.config_map), ("secretKeyRef", cluster.secret)):
                ref = source.get(ref_kind)
                if ref and lookup(ref["name"]) is not None and ref["key"] not in lookup(ref["name"]):
                    found.append(f"{where}: env {env['name']} reads key {ref['key']!r}, which "
                                 f"{ref['name']!r} does not have")
        for resource, amount in ((container.get("resources") or {}).get("requests") or {}).items():
            limit = ((container.get("resources") or {}).get("limits") or {}).get(resource)
            if resource not in _STANDARD_RESOURCES and str(limit) != str(amount):
                found.append(f"{where}: {container['name']} requests {amount} {resource} but limits {limit} "
                             "(an extended resource's request must equal its limit)")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates") or []}
    mounted = set()
    for volume in volumes.values():
        for item in (volume.get("configMap") or {}).get("items") or []:
            data = cluster.config_map(volume["configMap"]["name"]) or {}
            if item["key"] not in data:
                found.append(f"{where}: volume {volume['name']} maps key {item['key']!r}, which its ConfigMap lacks")
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim is not None and claim not in cluster.by_kind.get("PersistentVolumeClaim", {}):
            found.append(f"{where}: volume {volume['name']} claims {claim!r}, which is not in the kustomization")
    for container in _containers(pod):
        for mount in container.get("volumeMounts") or []:
            mounted.add(mount["name"])
            if mount["name"] not in volumes and mount["name"] not in claims:
                found.append(f"{where}: {container['name']} mounts {mount['name']!r}, which is neither a volume "
                             "nor a volume claim template of the pod")
    for name in (set(volumes) | claims) - mounted:
        found.append(f"{where}: volume {name!r} is mounted by no container")
    selector = (spec.get("selector") or {}).get("matchLabels")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if selector is not None and any(labels.get(k) != v for k, v in selector.items()):
        found.append(f"{where}: selector {selector} does not match its pod template's labels {labels}")
    if obj["kind"] == "StatefulSet":
        service = cluster.by_kind.get("Service", {}).get(spec.get("serviceName"))
        if service is None or (service.get("spec") or {}).get("clusterIP") != "None":
            found.append(f"{where}: serviceName {spec.get('serviceName')!r} is not a headless Service "
                         "in the kustomization")
    return found


def _selected_pods(cluster: Cluster, service: Mapping[str, Any]) -> list[dict[str, Any]]:
    selector = (service.get("spec") or {}).get("selector") or {}
    chosen = []
    for obj in cluster.workloads():
        labels = ((obj["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            chosen.append(obj)
    return chosen


def service_problems(cluster: Cluster) -> list[str]:
    """Each Service selects pods, and those listen on its target ports."""
    found = []
    for name, service in cluster.by_kind.get("Service", {}).items():
        pods = _selected_pods(cluster, service)
        if not pods:
            found.append(f"Service/{name}: its selector matches no pod template")
            continue
        ports = {p.get("containerPort") for obj in pods for c in _containers(_pod_spec(obj)) for p in c.get("ports") or []}
        names = {p.get("name") for obj in pods for c in _containers(_pod_spec(obj)) for p in c.get("ports") or []}
        for port in (service.get("spec") or {}).get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if target not in ports and target not in names:
                found.append(f"Service/{name}: port {port.get('port')} targets {target}, on which no selected "
                             "container listens")
    return found


def redis_workload(cluster: Cluster) -> dict[str, Any] | None:
    for obj in cluster.workloads():
        if any(_image_repository(c.get("image", "")).rsplit("/", 1)[-1] == "redis"
               for c in _pod_spec(obj).get("containers") or []):
            if obj["kind"] == "StatefulSet":
                return obj
    return None


def _service_port(cluster: Cluster, host: str, port: int, redis: Mapping[str, Any] | None) -> str | None:
    """Why ``host:port`` does not reach the Redis StatefulSet's pods (None: it does). ``host`` is
    a Service (``redis``, ``redis.<namespace>.svc...``) or a pod of a headless one (``redis-0.redis``)."""
    if redis is None:
        return "no Redis StatefulSet in the kustomization"
    labels = redis["spec"]["template"]["metadata"].get("labels") or {}
    parts = host.split(".")
    services = cluster.by_kind.get("Service", {})
    pod_of_headless = len(parts) >= 2 and parts[0] not in services and parts[1] in services
    if not pod_of_headless:
        if parts[0] not in services:
            return f"{host!r} is not a Service, nor a pod of the Redis StatefulSet's headless Service"
        service = services[parts[0]]
        selector = (service.get("spec") or {}).get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            return f"Service {parts[0]!r} does not select the Redis pods"
        if port not in {p.get("port") for p in service["spec"].get("ports") or []}:
            return f"Service {parts[0]!r} has no port {port}"
        return None
    pod, _, rest = host.partition(".")
    service_name = rest.split(".", 1)[0]
    if service_name != redis["spec"].get("serviceName"):
        return f"{host!r}: Service {service_name!r} is not the Redis StatefulSet's ({redis['spec'].get('serviceName')!r})"
    prefix = redis["metadata"]["name"] + "-"
    start = (redis["spec"].get("ordinals") or {}).get("start", 0)
    ordinal = pod[len(prefix):] if pod.startswith(prefix) else ""
    if not ordinal.isdigit() or not start <= int(ordinal) < start + replicas(redis):
        return f"{host!r} names no pod of StatefulSet {redis['metadata']['name']!r} (replicas {replicas(redis)})"
    listening = {p.get("containerPort") for c in redis["spec"]["template"]["spec"]["containers"] for p in c.get("ports") or []}
    if port not in listening:
        return f"the Redis pods do not listen on port {port}"
    return None


def url_address_problems(cluster: Cluster, url: str) -> list[str]:
    """SURREAL_REDIS_URL's hosts reach the Redis pods."""
    redis = redis_workload(cluster)
    if url.startswith(CLUSTER_SCHEMES):
        try:
            nodes = parse_cluster_url(url).nodes
        except ValueError as exc:
            return [str(exc)]
    else:
        parts = urlsplit(url)
        try:
            nodes = ((parts.hostname or "", parts.port or 6379),)
        except ValueError as exc:
            return [f"SURREAL_REDIS_URL: {exc}"]
    found = []
    for host, port in nodes:
        why = _service_port(cluster, host, port, redis)
        if why is not None:
            found.append(f"SURREAL_REDIS_URL host {host}:{port}: {why}")
    return found


def cli_acl_rules(run: str) -> dict[str, str]:
    """``surreal-redis acl --print-rules --run RUN``: user name -> its rules."""
    from click.testing import CliRunner

    from surreal_redis.cli import main as cli

    result = CliRunner().invoke(cli, ["acl", "--print-rules", "--run", run])
    if result.exit_code != 0:
        raise ValueError(f"surreal-redis acl --print-rules --run {run}: {result.output.strip()}")
    rules = {}
    for line in result.output.splitlines():
        match = re.fullmatch(r"ACL SETUSER (\S+) reset on >PASSWORD (.*)", line)
        if match:
            rules[match.group(1)] = match.group(2)
    return rules


def acl_problems(run: str, passwords: Mapping[str, str]) -> list[str]:
    """The ACL file acl_file.py writes for ``run`` gives every user the CLI's rules."""
    try:
        text = acl_file_text(run, passwords)
        expected = cli_acl_rules(run)
    except ValueError as exc:
        return [str(exc)]
    written = {}
    for line in text.splitlines():
        match = re.fullmatch(r"user (\S+) (?:reset )?on #[0-9a-f]{64} (.*)", line)
        if match:
            written[match.group(1)] = match.group(2)
    found = [f"the ACL file has no user {name}" for name in expected if name not in written]
    found += [f"ACL user {name}: the file's rules differ from `surreal-redis acl --print-rules`'s"
              for name in expected if name in written and written[name] != expected[name]]
    if written.get("default") != "~* &* +@all":
        found.append("the ACL file's default user (the administrator) is not ~* &* +@all")
    return found


def conf_directives(text: str) -> list[str]:
    """A redis.conf's settings: its lines without comments and blank lines, in order."""
    return [" ".join(line.split()) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _mounted_file(cluster: Cluster, pod: Mapping[str, Any], container: Mapping[str, Any], path: str) -> str | None:
    """The text of ``path`` in ``container`` when a ConfigMap volume provides it."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"]) or {}
        target = mount["mountPath"].rstrip("/") + "/"
        if "configMap" in volume and path.startswith(target):
            data = cluster.config_map(volume["configMap"]["name"]) or {}
            key = path[len(target):]
            for item in volume["configMap"].get("items") or []:
                if item["path"] == key:
                    key = item["key"]
            return data.get(key)
    return None


def _mount_of(container: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    for mount in container.get("volumeMounts") or []:
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return mount
    return None


def redis_problems(cluster: Cluster, obj: Mapping[str, Any], container: Mapping[str, Any],
                   variables: Mapping[str, str], args: list[str], acl_path: str | None) -> list[str]:
    """The Redis container: its config file, persistence, memory cap and cluster settings."""
    where = f"{obj['kind']}/{obj['metadata']['name']}: {container['name']}"
    pod = _pod_spec(obj)
    if len(args) < 2 or args[0] != "redis-server":
        return [f"{where}: args must be redis-server CONFIG [options], got {args}"]
    text = _mounted_file(cluster, pod, container, args[1])
    if text is None:
        return [f"{where}: {args[1]} is not a file of a ConfigMap mounted into the container"]
    directives = conf_directives(text)
    settings = {d.split(" ", 1)[0]: d.split(" ", 1)[-1] for d in directives}
    options = dict(zip(args[2::2], args[3::2]))
    cluster_node = settings.get("cluster-enabled") == "yes"
    compose_conf = COMPOSE_DIR / ("redis-cluster.conf" if cluster_node else "redis.conf")
    found = []
    if sorted(directives) != sorted(conf_directives(compose_conf.read_text())):
        found.append(f"{where}: {args[1]}'s settings differ from compose/{compose_conf.name}'s: "
                     f"{sorted(set(directives) ^ set(conf_directives(compose_conf.read_text())))}")
    for key, value in (("appendonly", "yes"), ("maxmemory-policy", "noeviction")):
        if settings.get(key) != value:
            found.append(f"{where}: {key} must be {value}, is {settings.get(key)}")
    data_mount = _mount_of(container, settings.get("dir", "/data"))
    claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates") or []}
    if data_mount is None or data_mount["name"] not in claims:
        found.append(f"{where}: dir {settings.get('dir')} (the AOF) is not on a volume claim template")
    if acl_path is not None and settings.get("aclfile") != acl_path:
        found.append(f"{where}: aclfile is {settings.get('aclfile')}, but the acl init container writes {acl_path}")
    if acl_path is not None and _mount_of(container, acl_path) is None:
        found.append(f"{where}: {acl_path} (the ACL file) is not mounted into the redis container")
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    try:
        maxmemory = redis_bytes(options.get("--maxmemory", settings.get("maxmemory", "0")))
        if limit is None or maxmemory >= quantity_bytes(limit):
            found.append(f"{where}: maxmemory {options.get('--maxmemory')} must be below the memory limit {limit} "
                         "(else the kernel, not Redis, stops it)")
    except ValueError as exc:
        found.append(f"{where}: {exc}")
    if cluster_node:
        if options.get("--cluster-announce-ip") != _field("status.podIP", Pod("", None, {})):
            found.append(f"{where}: a cluster node must announce its pod IP (--cluster-announce-ip $(POD_IP) "
                         "with POD_IP from status.podIP)")
        if options.get("--masterauth") != variables.get("REDISCLI_AUTH") or not options.get("--masterauth"):
            found.append(f"{where}: --masterauth must be the administrator's password (masteruser default)")
    return found


def mlflow_problems(cluster: Cluster, tracking_uris: set[str]) -> list[str]:
    """The MLflow server's options parse; the learner's URI reaches it and its host is allowed."""
    found = []
    servers = [(obj, c) for obj in cluster.workloads() for c in _pod_spec(obj).get("containers") or []
               if c.get("command") == ["mlflow", "server"]]
    for obj, container in servers:
        found += [f"{obj['kind']}/{obj['metadata']['name']}: {p}"
                  for p in compose_validate.mlflow_server_problems(container.get("args") or [])]
    for uri in tracking_uris:
        parts = urlsplit(uri)
        service = cluster.by_kind.get("Service", {}).get(parts.hostname or "")
        if service is None or parts.port not in {p.get("port") for p in service["spec"].get("ports") or []}:
            found.append(f"MLFLOW_TRACKING_URI {uri}: {parts.hostname}:{parts.port} is not a Service and port")
            continue
        selected = {id(o) for o in _selected_pods(cluster, service)}
        allowed = [a.split("=", 1)[1] for obj, c in servers if id(obj) in selected
                   for a in c.get("args") or [] if a.startswith("--allowed-hosts=")]
        if not selected & {id(obj) for obj, _ in servers}:
            found.append(f"MLFLOW_TRACKING_URI {uri}: Service {parts.hostname!r} does not select the MLflow server")
        elif allowed and f"{parts.hostname}:{parts.port}" not in allowed[0].split(","):
            found.append(f"MLFLOW_TRACKING_URI {uri}: the server's --allowed-hosts does not let "
                         f"{parts.hostname}:{parts.port} in")
    return found


def process_problems(cluster: Cluster, obj: Mapping[str, Any], container: Mapping[str, Any], pod: Pod,
                     args: list[str], variables: Mapping[str, str],
                     passwords: Mapping[str, str]) -> tuple[list[str], tuple | None]:
    """One surreal-redis process: its command line, config, Redis login and address."""
    from surreal_redis.config import load_config

    where = f"{obj['kind']}/{obj['metadata']['name']} (pod {pod.name}): {container['name']}"

    def no_container_name() -> str:
        raise EntrypointError("a Kubernetes pod has no compose container name: set AGENT_ID "
                              f"(from the {POD_INDEX_LABEL} label)")

    try:
        full = complete(args, variables, container_name=no_container_name, has_checkpoint=lambda _: False)
        at = command_index(full)
    except EntrypointError as exc:
        return [f"{where}: {exc}"], None
    problem, params = compose_validate.parse_command(where, full, at)
    if params is None:
        return [problem], None
    found = []
    if full[at] == "agent" and pod.ordinal is not None and params["agent_id"] != pod.ordinal:
        found.append(f"{where}: pod {pod.name} runs agent --id {params['agent_id']}, not {pod.ordinal}")
    if params.get("config_path") is None:
        return found + [f"{where}: no --config"], None
    config_path = params["config_path"]
    with tempfile.TemporaryDirectory() as tmp:
        text = _mounted_file(cluster, _pod_spec(obj), container, config_path) if config_path.startswith("/") else None
        source: str | Path = config_path
        if text is not None:
            source = Path(tmp) / Path(config_path).name
            source.write_text(text)
        try:
            config = load_config(source, params["overrides"])
        except ValueError as exc:
            return found + [f"{where}: --config {config_path} with {list(params['overrides'])}: {exc}"], None
    role = full[at] if full[at] in ROLES else None
    service = {"environment": {k: v for k, v in variables.items() if k == "SURREAL_REDIS_URL"}}
    found += [f"{where}: {p.split(': ', 1)[1]}"
              for p in compose_validate.url_problems("x", service, passwords, config.run, role)]
    if "SURREAL_REDIS_URL" in variables:
        found += [f"{where}: {p}" for p in url_address_problems(cluster, variables["SURREAL_REDIS_URL"])]
    return found, (config_path, tuple(sorted(params["overrides"])), config.run)


def objects_problems(objects: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> list[str]:
    """Every problem of one rendered kustomization (module docstring)."""
    cluster = Cluster(objects)
    found = schema_problems(objects, version) + service_problems(cluster)
    passwords = next((s for s in (cluster.secret(n) for n in cluster.by_kind.get("Secret", {}))
                      if s and ADMIN_VARIABLE in s), {})
    experiments: dict[str, tuple] = {}
    acl_runs: set[str] = set()
    tracking_uris: set[str] = set()
    redis = redis_workload(cluster)
    if redis is None:
        found.append("no Redis StatefulSet (a redis image) in the kustomization")
    for obj in cluster.workloads():
        found += reference_problems(cluster, obj)
        acl_path = None
        for pod in sample_pods(obj):
            for container in _containers(_pod_spec(obj)):
                where = f"{obj['kind']}/{obj['metadata']['name']} (pod {pod.name}): {container['name']}"
                variables = container_env(cluster, container, pod, found, where)
                command, args = container_command(container, variables, found, where)
                if command is not None and command[-1:] and command[-1].endswith("/acl_file.py"):
                    if len(args) != 2:
                        found.append(f"{where}: acl_file.py takes RUN PATH, got {args}")
                        continue
                    acl_runs.add(args[0])
                    acl_path = args[1]
                    if _mount_of(container, str(Path(args[1]).parent)) is None:
                        found.append(f"{where}: writes {args[1]} outside its volume mounts")
                    found += [f"{where}: {p}" for p in acl_problems(args[0], variables)]
                elif command is None and is_surreal_image(container.get("image", "")):
                    problems, experiment = process_problems(cluster, obj, container, pod, args, variables, passwords)
                    found += problems
                    if experiment is not None:
                        experiments[f"{obj['metadata']['name']}/{container['name']}"] = experiment
                    if "MLFLOW_TRACKING_URI" in variables:
                        tracking_uris.add(variables["MLFLOW_TRACKING_URI"])
                elif obj is redis and container in (_pod_spec(obj).get("containers") or []):
                    found += redis_problems(cluster, obj, container, variables, [*(command or []), *args], acl_path)
    found += mlflow_problems(cluster, tracking_uris)
    if len(set(experiments.values())) > 1:
        found.append("the processes run different experiments: "
                     + "; ".join(f"{n}: {e[0]} {list(e[1])}" for n, e in sorted(experiments.items())))
    runs = {e[2] for e in experiments.values()}
    if acl_runs and runs and acl_runs != runs:
        found.append(f"the ACL file is written for run(s) {sorted(acl_runs)}, the processes run {sorted(runs)}")
    if redis is not None and not acl_runs:
        found.append("the Redis pod has no acl init container writing the run's users")
    return sorted(set(found), key=found.index)


# ---------------------------------------------------------------- rendering

def prepared_copy(kubernetes_dir: Path, target: Path, passwords: Mapping[str, str] | None = None) -> Path:
    """A copy of ``kubernetes_dir`` in ``target`` with base/passwords.env: ``passwords`` when given,
    else the folder's own file, else the example passwords."""
    shutil.copytree(kubernetes_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    file = target / PASSWORDS_FILE
    if passwords is not None or not file.exists():
        values = passwords if passwords is not None else EXAMPLE_PASSWORDS
        file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return target


def kubectl_differences(folder: Path) -> list[str]:
    """Where ``kubectl kustomize FOLDER`` renders other objects than kustomize_render.py (empty:
    the same, or no kubectl here: see :func:`kubectl_available`)."""
    if not kubectl_available():
        return []
    result = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return [f"kubectl kustomize {folder.name}: {result.stderr.strip()}"]
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(result.stdout) if o}
    try:
        ours = {(o["kind"], o["metadata"]["name"]): o for o in render(folder)}
    except RenderError as exc:
        return [f"kustomize_render: {exc}"]
    found = [f"{kind}/{name}: only kubectl renders it" for kind, name in sorted(set(theirs) - set(ours))]
    found += [f"{kind}/{name}: only kustomize_render.py renders it" for kind, name in sorted(set(ours) - set(theirs))]
    found += [f"{kind}/{name}: rendered differently" for kind, name in sorted(set(ours) & set(theirs))
              if ours[(kind, name)] != theirs[(kind, name)]]
    return found


def kubectl_available() -> bool:
    return shutil.which("kubectl") is not None


def problems(kubernetes_dir: Path = KUBERNETES_DIR, passwords: Mapping[str, str] | None = None,
             targets: tuple[str, ...] = TARGETS, with_kubectl: bool = True) -> list[str]:
    """Every problem of the base and overlays in ``kubernetes_dir``."""
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = prepared_copy(kubernetes_dir, Path(tmp) / "kubernetes", passwords)
        for target in targets:
            try:
                objects = render(copy / target)
            except RenderError as exc:
                found.append(f"{target}: {exc}".replace(str(copy) + "/", ""))
                continue
            found += [f"{target}: {p}" for p in objects_problems(objects)]
            if with_kubectl:
                found += [f"{target}: {p}" for p in kubectl_differences(copy / target)]
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passwords", type=Path, default=None,
                        help=f"a passwords.env (default: {PASSWORDS_FILE}, else example passwords)")
    options = parser.parse_args(argv)
    from kustomize_render import read_env_file

    passwords = read_env_file(options.passwords) if options.passwords else None
    if not kubectl_available():
        print("note: no kubectl here: the Python rendering is not compared with kubectl kustomize", file=sys.stderr)
    found = problems(passwords=passwords)
    for line in found:
        print(line)
    print(f"{len(found)} problems in {', '.join(TARGETS)} (Kubernetes {KUBERNETES_VERSION} schemas)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
