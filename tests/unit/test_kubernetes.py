"""deploy/kubernetes/, checked offline (no cluster here): the base and every overlay render, pass
the Kubernetes API schema and deploy/kubernetes/validate.py; each of validate.py's checks catches
the breakage it is for; kustomize_render.py renders as Kustomize does (against kubectl where it is
installed, else against outputs kubectl gave); docs/kubernetes.md names paths that exist."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from surreal_redis.acl import ROLES, acl_rules, username

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')")


def _load(name: str, path: Path) -> ModuleType:
    """A module by path, under a name of its own (compose/ has a validate.py too)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


validate = _load("kubernetes_validate_deploy", KUBERNETES_DIR / "validate.py")
kustomize = sys.modules["kustomize_render"]  # the module validate.py renders with
needs_kubectl = pytest.mark.skipif(not validate.kubectl_available(),
                                   reason="no kubectl here: cannot compare with kubectl kustomize")


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """deploy/kubernetes/ with the example passwords, in a folder the test may edit."""
    return validate.prepared_copy(KUBERNETES_DIR, tmp_path / "kubernetes", validate.EXAMPLE_PASSWORDS)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def rendered(folder: Path, target: str = "base") -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in kustomize.render(folder / target)}


def workload(objects: dict[tuple[str, str], dict], kind: str, name: str) -> dict:
    return objects[(kind, name)]


def container(obj: dict, name: str) -> dict:
    return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# ---------------------------------------------------------------- the shipped files

def test_shipped_base_and_overlays_pass_the_schema_and_every_check():
    assert validate.problems() == []


def test_the_schemas_are_of_the_named_version_and_agree_with_kubernetes_validate(deploy_copy):
    import kubernetes_validate

    assert validate.KUBERNETES_VERSION == "1.32.0"
    assert "1.32.0" in kubernetes_validate.utils.all_versions()
    objects = list(rendered(deploy_copy, "overlays/redis-cluster").values())
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Deployment", "Job", "Service", "ConfigMap", "Secret"}
    for obj in objects:  # the package's own validate(), which the cached validators must agree with
        assert kubernetes_validate.validate(obj, validate.KUBERNETES_VERSION, strict=True) == "1.32"
    assert validate.schema_problems(objects) == []
    broken = copy.deepcopy(next(o for o in objects if o["kind"] == "StatefulSet"))
    broken["spec"]["podManagmentPolicy"] = "Parallel"  # strict: an unknown field fails
    broken["spec"]["replicas"] = "four"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, validate.KUBERNETES_VERSION, strict=True)
    found = validate.schema_problems([broken])
    assert len(found) == 2 and "podManagmentPolicy" in found[0] + found[1] and "spec.replicas: 'four'" in found[0] + found[1]
    assert validate.schema_problems([{"apiVersion": "example.org/v1", "kind": "Thing", "metadata": {"name": "t"}}]) == [
        "Thing/t: Kubernetes 1.32.0 has no example.org/v1 Thing"]


def test_schema_validation_needs_no_network(deploy_copy, monkeypatch):
    import socket

    objects = list(rendered(deploy_copy).values())
    validate.schema_validator.cache_clear()
    validate._schema_file.cache_clear()

    def no_network(*args, **kwargs):
        raise AssertionError("schema validation opened a socket")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    assert validate.schema_problems(objects) == []


def test_every_process_of_the_base_is_a_checked_surreal_redis_command(deploy_copy):
    objects = rendered(deploy_copy)
    processes = {(kind, name) for (kind, name), obj in objects.items() if kind in ("StatefulSet", "Deployment")
                 for c in obj["spec"]["template"]["spec"]["containers"]
                 if validate.is_surreal_image(c["image"]) and "command" not in c}
    assert processes == {("StatefulSet", "learner"), ("StatefulSet", "agents"), ("Deployment", "eval")}
    assert {kind for kind, _ in objects} == {"ConfigMap", "Secret", "Service", "StatefulSet", "Deployment"}
    # every volume is a StatefulSet's claim template: `kubectl delete -k` keeps them all
    claims = {(name, t["metadata"]["name"]) for (kind, name), obj in objects.items() if kind == "StatefulSet"
              for t in obj["spec"].get("volumeClaimTemplates") or []}
    assert claims == {("redis", "data"), ("learner", "runs"), ("mlflow", "mlflow")}
    assert workload(objects, "StatefulSet", "agents")["spec"]["replicas"] == 4
    assert container(workload(objects, "StatefulSet", "learner"), "learner")["args"][-2:] == ["--resume", "auto"]


def test_agent_pods_run_their_ordinal_as_agent_id(deploy_copy):
    """Pod agents-K of the StatefulSet is agent K: AGENT_ID from the pod-index label, then --id auto."""
    objects = rendered(deploy_copy, "overlays/more-agents")
    agents = workload(objects, "StatefulSet", "agents")
    assert agents["spec"]["replicas"] == 16
    assert [p.name for p in validate.sample_pods(agents)] == ["agents-0", "agents-15"]
    cluster = validate.Cluster(list(objects.values()))
    for pod in validate.sample_pods(agents):
        found: list[str] = []
        env = validate.container_env(cluster, container(agents, "agent"), pod, found, "agents")
        _, args = validate.container_command(container(agents, "agent"), env, found, "agents")
        completed = validate.complete(args, env, container_name=lambda: pytest.fail("no DNS lookup"))
        assert completed[:3] == ["agent", "--id", str(pod.ordinal)] and found == []
        assert env["SURREAL_REDIS_URL"] == (f"redis://{username('k8s', 'agent')}:"
                                            f"{validate.EXAMPLE_PASSWORDS['SURREAL_AGENT_PASSWORD']}@redis:6379/0")


def test_gpu_overlay_changes_only_the_learner(deploy_copy):
    base, gpu = rendered(deploy_copy), rendered(deploy_copy, "overlays/gpu")
    learner = container(workload(gpu, "StatefulSet", "learner"), "learner")
    assert learner["image"] == "surreal-redis:cuda"
    assert learner["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": 1}
    assert learner["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert {k for k in base if base[k] != gpu[k]} == {("StatefulSet", "learner")}


def test_redis_cluster_overlay_runs_six_nodes_and_cluster_urls(deploy_copy):
    objects = rendered(deploy_copy, "overlays/redis-cluster")
    redis = workload(objects, "StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 6
    conf = next(o for (kind, name), o in objects.items() if kind == "ConfigMap" and name.startswith("redis-conf-"))
    assert "cluster-enabled yes" in conf["data"]["redis.conf"]
    run = next(o for (kind, name), o in objects.items() if kind == "ConfigMap" and name.startswith("surreal-run-"))
    assert run["data"]["REDIS_URL_SCHEME"] == "redis+cluster"
    assert run["data"]["SURREAL_RUN"] == "k8s"  # merged into the base's, not replacing it
    assert ("Job", "redis-cluster-create") in objects


def test_passwords_example_names_what_the_acl_file_needs_and_stays_out_of_git():
    example = kustomize.read_env_file(KUBERNETES_DIR / "base" / "passwords.env.example")
    assert set(example) == set(validate.EXAMPLE_PASSWORDS) == {
        validate.ADMIN_VARIABLE, *(validate.compose_validate.password_variable(role) for role in ROLES)}
    assert "passwords.env" in (KUBERNETES_DIR / "base" / ".gitignore").read_text().split()


def test_acl_rules_are_the_clis():
    rules = validate.cli_acl_rules("k8s")
    assert rules == {username("k8s", role): " ".join(acl_rules("k8s", role)) for role in ROLES}
    assert validate.acl_problems("k8s", validate.EXAMPLE_PASSWORDS) == []


def test_acl_file_with_other_rules_is_caught(monkeypatch):
    real = validate.acl_file_text

    def widened(run, env):
        return real(run, env).replace(" -@all ", " +@all ", 1)

    monkeypatch.setattr(validate, "acl_file_text", widened)
    found = validate.acl_problems("k8s", validate.EXAMPLE_PASSWORDS)
    assert found == [f"ACL user {username('k8s', 'agent')}: the file's rules differ from "
                     "`surreal-redis acl --print-rules`'s"]


# ---------------------------------------------------------------- each check catches its breakage

@pytest.mark.parametrize(("path", "old", "new", "complaint"), [
    ("base/agents.yaml", '"--id", "auto"', '"--id", "first"', "surreal-redis agent --id first"),
    ("base/agents.yaml", '["agent", "--id"', '["agent", "--ids"', "No such option"),
    ("base/agents.yaml", "fieldPath: metadata.labels['apps.kubernetes.io/pod-index']", "fieldPath: metadata.name",
     "AGENT_ID must be a whole number >= 0, got 'agents-0'"),
    ("base/agents.yaml", "              valueFrom:\n                fieldRef:\n                  fieldPath: metadata.labels['apps.kubernetes.io/pod-index']",
     '              value: "0"', "pod agents-3 runs agent --id 0, not 3"),
    ("base/eval.yaml", '["eval", "--config"', '["evaluate", "--config"', "'evaluate' is not a surreal-redis command"),
    ("base/learner.yaml", '"--resume", "auto"]', '"--resume", "auto", "-o", "ppo.no_such_key=1"]', "no_such_key"),
    ("base/eval.yaml", '"$(SURREAL_CONFIG)"', '"ddpg_pendulum"', "the processes run different experiments"),
    ("base/kustomization.yaml", "SURREAL_CONFIG=ppo_cartpole", "SURREAL_CONFIG=no_such_config",
     "no_such_config' does not exist"),
    ("base/learner.yaml", "sr-$(SURREAL_RUN)-learner", "sr-$(SURREAL_RUN)-agent", "not as 'sr-k8s-learner'"),
    ("base/learner.yaml", "key: SURREAL_LEARNER_PASSWORD}", "key: SURREAL_AGENT_PASSWORD}",
     "the password in SURREAL_REDIS_URL is not SURREAL_LEARNER_PASSWORD"),
    ("base/eval.yaml", "key: SURREAL_EVAL_PASSWORD}", "key: SURREAL_EVAL_PASWORD}",
     "reads key 'SURREAL_EVAL_PASWORD', which"),
    ("base/eval.yaml", "name: surreal-run\n", "name: surreal-runs\n",
     "names ConfigMap 'surreal-runs', which is not in the kustomization"),
    ("base/kustomization.yaml", "REDIS_URL_HOSTS=redis:6379/0", "REDIS_URL_HOSTS=redis-master:6379/0",
     "'redis-master' is not a Service"),
    ("base/kustomization.yaml", "REDIS_URL_HOSTS=redis:6379/0", "REDIS_URL_HOSTS=redis:6380/0",
     "Service 'redis' has no port 6380"),
    ("base/learner.yaml", "            - name: SURREAL_LEARNER_PASSWORD\n              valueFrom:\n                secretKeyRef: {name: surreal-passwords, key: SURREAL_LEARNER_PASSWORD}\n            - name: SURREAL_REDIS_URL\n              value: $(REDIS_URL_SCHEME)://sr-$(SURREAL_RUN)-learner:$(SURREAL_LEARNER_PASSWORD)@$(REDIS_URL_HOSTS)\n",
     "            - name: SURREAL_REDIS_URL\n              value: $(REDIS_URL_SCHEME)://sr-$(SURREAL_RUN)-learner:$(SURREAL_LEARNER_PASSWORD)@$(REDIS_URL_HOSTS)\n            - name: SURREAL_LEARNER_PASSWORD\n              valueFrom:\n                secretKeyRef: {name: surreal-passwords, key: SURREAL_LEARNER_PASSWORD}\n",
     "env SURREAL_REDIS_URL uses $(SURREAL_LEARNER_PASSWORD), which is not defined before it"),
    ("base/redis.yaml", "            - name: data\n              mountPath: /data", "            - name: dat\n              mountPath: /data",
     "mounts 'dat', which is neither a volume nor a volume claim template"),
    ("base/redis.conf", "maxmemory-policy noeviction", "maxmemory-policy allkeys-lru", "maxmemory-policy must be noeviction"),
    ("base/redis.conf", "appendonly yes", "appendonly no", "appendonly must be yes"),
    ("base/redis.conf", "lazyfree-lazy-user-del yes\n", "", "settings differ from compose/redis.conf's"),
    ("base/redis.conf", "dir /data", "dir /var/lib/redis", "dir /var/lib/redis (the AOF) is not on a volume claim template"),
    ("base/kustomization.yaml", "REDIS_MAXMEMORY=4gb", "REDIS_MAXMEMORY=6gb", "must be below the memory limit 5Gi"),
    ("base/redis.yaml", '"/acl/users.acl"]', '"/acl/people.acl"]',
     "aclfile is /acl/users.acl, but the acl init container writes /acl/people.acl"),
    ("base/redis.yaml", 'args: ["$(SURREAL_RUN)", ', 'args: ["other", ', "the ACL file is written for run(s) ['other']"),
    ("base/redis.yaml", "            - secretRef:\n                name: surreal-passwords\n", "",
     "SURREAL_ADMIN_PASSWORD must be at least 16 characters"),
    ("base/mlflow.yaml", '"--port=5000"', '"--prot=5000"', "mlflow server --host=0.0.0.0 --prot=5000"),
    ("base/mlflow.yaml", "--allowed-hosts=mlflow:5000,", "--allowed-hosts=", "does not let mlflow:5000 in"),
    ("base/mlflow.yaml", "      targetPort: 5000", "      targetPort: 5050", "targets 5050, on which no selected container"),
    ("base/learner.yaml", "http://mlflow:5000", "http://mlflow:5001", "mlflow:5001 is not a Service and port"),
    ("base/eval.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: surreal-redis\n      app.kubernetes.io/component: eval",
     "  selector:\n    matchLabels:\n      app.kubernetes.io/name: surreal-redis\n      app.kubernetes.io/component: evaluator",
     "does not match its pod template's labels"),
    ("base/agents.yaml", "serviceName: agents", "serviceName: agent", "serviceName 'agent' is not a headless Service"),
    ("base/agents.yaml", "podManagementPolicy: Parallel", "podManagmentPolicy: Parallel", "podManagmentPolicy"),
    ("base/agents.yaml", "replicas: 4", "replicas: four", "StatefulSet/agents: Kubernetes 1.32.0 schema: spec.replicas"),
    ("base/kustomization.yaml", "      - redis.conf\n", "      - redis-server.conf\n", "redis-server.conf does not exist"),
    ("base/kustomization.yaml", "resources:\n", "namePrefix: x-\nresources:\n", "namePrefix not implemented here"),
    ("overlays/gpu/learner-gpu.yaml", "requests: {nvidia.com/gpu: 1}", "requests: {nvidia.com/gpu: 2}",
     "requests 2 nvidia.com/gpu but limits 1"),
    ("overlays/gpu/learner-gpu.yaml", "  name: learner\n", "  name: trainer\n", "0 StatefulSet objects named 'trainer'"),
    ("overlays/redis-cluster/kustomization.yaml", "redis-2.redis:6379\n", "redis-6.redis:6379\n",
     "'redis-6.redis' names no pod of StatefulSet 'redis' (replicas 6)"),
    ("overlays/redis-cluster/kustomization.yaml", "redis-2.redis:6379\n", "redis-2.redis-nodes:6379\n",
     "is not a Service, nor a pod of the Redis StatefulSet's headless Service"),
    ("overlays/redis-cluster/redis-nodes.yaml", "fieldPath: status.podIP", "fieldPath: spec.nodeName",
     "a cluster node must announce its pod IP"),
    ("overlays/redis-cluster/redis-nodes.yaml", '"--masterauth", "$(REDISCLI_AUTH)", ', "",
     "--masterauth must be the administrator's password"),
    ("overlays/redis-cluster/redis-cluster.conf", "cluster-require-full-coverage no", "cluster-require-full-coverage yes",
     "settings differ from compose/redis-cluster.conf's"),
])
def test_each_check_catches_its_breakage(deploy_copy, path, old, new, complaint):
    edit(deploy_copy / path, old, new)
    target = str(Path(path).parent) if path.startswith("overlays/") else "base"
    found = validate.problems(deploy_copy, validate.EXAMPLE_PASSWORDS, targets=(target,), with_kubectl=False)
    assert any(complaint in line for line in found), found


def test_short_passwords_are_refused_without_printing_them(deploy_copy):
    passwords = {**validate.EXAMPLE_PASSWORDS, "SURREAL_EVAL_PASSWORD": "short"}
    found = validate.problems(deploy_copy, passwords, targets=("base",), with_kubectl=False)
    assert any("SURREAL_EVAL_PASSWORD must be at least 16 characters" in line for line in found), found
    assert not any("short" in line.replace("it is 5 characters", "") for line in found)


# ---------------------------------------------------------------- the kubelet's variable expansion

def test_expansion_follows_kubernetes():
    variables = {"A": "x", "B": ""}
    assert validate.expand("$(A)-$(B)-$(C)-$$(A)-$(A", variables) == "x--$(C)-$(A)-$(A"
    assert validate.expand('ip=$(getent hosts "redis-$i.redis" | awk)', variables) == 'ip=$(getent hosts "redis-$i.redis" | awk)'
    assert validate.unresolved("$(A) $(C) $$(D)", variables) == ["C"]


def test_env_resolves_in_order_after_env_from():
    cluster = validate.Cluster([{"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"RUN": "r"}}])
    spec = {"envFrom": [{"configMapRef": {"name": "c"}}],
            "env": [{"name": "URL", "value": "$(RUN)-$(LATER)"}, {"name": "LATER", "value": "l"},
                    {"name": "AFTER", "value": "$(LATER)$(URL)"}]}
    found: list[str] = []
    env = validate.container_env(cluster, spec, validate.Pod("p-0", 0, {}), found, "p")
    assert env == {"RUN": "r", "URL": "r-$(LATER)", "LATER": "l", "AFTER": "lr-$(LATER)"}
    assert found == ["p: env URL uses $(LATER), which is not defined before it (the kubelet leaves it as written)"]


@pytest.mark.parametrize(("redis", "kubernetes", "below"), [("4gb", "5Gi", True), ("5gb", "5Gi", False),
                                                            ("5g", "5Gi", True), ("512mb", "1G", True)])
def test_memory_units(redis, kubernetes, below):
    assert (validate.redis_bytes(redis) < validate.quantity_bytes(kubernetes)) is below


def test_bad_memory_sizes_are_named():
    with pytest.raises(ValueError, match="not a Redis memory size: '4 gigs'"):
        validate.redis_bytes("4 gigs")
    with pytest.raises(ValueError, match="not a Kubernetes memory quantity: '5GB'"):
        validate.quantity_bytes("5GB")


# ---------------------------------------------------------------- kustomize_render.py

# kubectl kustomize (v5.5.0) gave these names for these generators
@pytest.mark.parametrize(("kind", "data", "name"), [
    ("ConfigMap", {"A": "1"}, "x-89g4tffbfk"),
    ("ConfigMap", {"K": "a<b>&c", "L": "ü"}, "x-c52ctb5dct"),
])
def test_generated_names_carry_kustomizes_hash(kind, data, name):
    assert "x-" + kustomize.name_hash({"kind": kind, "metadata": {"name": "x"}, "data": data}) == name


def test_secret_hash_and_reference_renaming(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["pod.yaml"], "secretGenerator": [{"name": "s", "literals": ["P=q<&>"]}]}))
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "envFrom": [{"secretRef": {"name": "s"}}],
                                 "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "P"}}}]}],
                 "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}}))
    secret, pod = kustomize.render(tmp_path)[::-1]
    assert secret["metadata"]["name"] == "s-hchfdcdmfg" and secret["type"] == "Opaque"
    assert secret["data"] == {"P": "cTwmPg=="}
    spec = pod["spec"]
    assert spec["containers"][0]["envFrom"][0]["secretRef"]["name"] == "s-hchfdcdmfg"
    assert spec["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "s-hchfdcdmfg"
    assert spec["volumes"][0]["secret"]["secretName"] == "s-hchfdcdmfg"


MERGE_TARGET = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
    "containers": [{"name": "c", "image": "i", "args": ["a"],
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
                    "volumeMounts": [{"name": "v", "mountPath": "/a"}, {"name": "w", "mountPath": "/b"}]},
                   {"name": "e", "image": "j"}]}}}}
MERGE_PATCH = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
    "containers": [{"name": "e", "image": "k"},
                   {"name": "c", "args": None, "volumeMounts": [{"name": "z", "mountPath": "/b"}],
                    "env": [{"name": "C", "value": "9"}, {"name": "X", "value": "4"}, {"name": "A", "value": None}]}]}}}}
# what kubectl kustomize (v5.5.0) renders: the patch's items first, then the target's others
MERGED_CONTAINERS = [
    {"name": "e", "image": "k"},
    {"name": "c", "image": "i", "env": [{"name": "C", "value": "9"}, {"name": "X", "value": "4"}, {"name": "A"},
                                        {"name": "B", "value": "2"}],
     "volumeMounts": [{"name": "z", "mountPath": "/b"}, {"name": "v", "mountPath": "/a"}]}]


def _merge_fixture(folder: Path) -> Path:
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["d.yaml"], "patches": [{"path": "p.yaml"}]}))
    (folder / "d.yaml").write_text(yaml.safe_dump(MERGE_TARGET))
    (folder / "p.yaml").write_text(yaml.safe_dump(MERGE_PATCH))
    return folder


def test_strategic_merge_as_kustomize(tmp_path):
    [merged] = kustomize.render(_merge_fixture(tmp_path))
    assert merged["spec"]["template"]["spec"]["containers"] == MERGED_CONTAINERS
    assert MERGE_TARGET["spec"]["template"]["spec"]["containers"][0]["args"] == ["a"]  # inputs untouched


def test_replicas_images_and_generator_behaviors(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["d.yaml"], "configMapGenerator": [{"name": "c", "literals": ["A=1", "B=2"]},
                                                        {"name": "r", "literals": ["A=1"]}]}))
    (tmp_path / "base" / "d.yaml").write_text(yaml.safe_dump(MERGE_TARGET))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["base"], "replicas": [{"name": "d", "count": 3}],
        "images": [{"name": "i", "newName": "registry.example.org/i", "newTag": "v2"}, {"name": "j", "newName": "m/j"}],
        "configMapGenerator": [{"name": "c", "behavior": "merge", "literals": ["B=3"]},
                               {"name": "r", "behavior": "replace", "literals": ["Z=0"]}]}))
    objects = {o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap" else o["metadata"]["name"]: o
               for o in kustomize.render(tmp_path)}
    assert objects["c"]["data"] == {"A": "1", "B": "3"} and objects["r"]["data"] == {"Z": "0"}
    assert objects["d"]["spec"]["replicas"] == 3
    assert [c["image"] for c in objects["d"]["spec"]["template"]["spec"]["containers"]] == ["registry.example.org/i:v2", "m/j"]


@pytest.mark.parametrize(("kustomization", "complaint"), [
    ({"resources": ["d.yaml"], "namePrefix": "x-"}, "namePrefix not implemented here"),
    ({"resources": ["d.yaml"], "patches": [{"path": "p.yaml", "target": {"kind": "Deployment"}}]},
     "only patches with a path"),
    ({"resources": ["d.yaml", "missing.yaml"]}, "missing.yaml does not exist"),
    ({"resources": ["d.yaml"], "configMapGenerator": [{"name": "c", "literals": ["A=1"]}, {"name": "c", "literals": ["B"]}]},
     "is not KEY=VALUE"),
    ({"resources": ["d.yaml"], "configMapGenerator": [{"name": "c", "literals": ["A=1"]}, {"name": "c", "literals": ["B=1"]}]},
     "is generated twice"),
    ({"resources": ["d.yaml"], "configMapGenerator": [{"name": "c", "behavior": "merge", "literals": ["A=1"]}]},
     "which no base generates"),
    ({"resources": ["d.yaml"], "replicas": [{"name": "nothing", "count": 2}]}, "no workload of that name"),
    ({"resources": ["."]}, "a kustomization includes itself"),
])
def test_renderer_refuses_what_it_does_not_implement(tmp_path, kustomization, complaint):
    _merge_fixture(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    with pytest.raises(kustomize.RenderError, match=re.escape(complaint)):
        kustomize.render(tmp_path)


def test_patch_directives_are_refused():
    with pytest.raises(kustomize.RenderError, match=r"'\$patch' is not implemented"):
        kustomize.strategic_merge({"a": [1]}, {"a": {"$patch": "replace"}})


@needs_kubectl
@pytest.mark.parametrize("target", validate.TARGETS)
def test_kubectl_kustomize_renders_the_same(deploy_copy, target):
    assert validate.kubectl_differences(deploy_copy / target) == []


@needs_kubectl
def test_kubectl_kustomize_merges_the_same(tmp_path):
    assert validate.kubectl_differences(_merge_fixture(tmp_path)) == []


# ---------------------------------------------------------------- docs

def test_docs_name_paths_and_overlays_that_exist():
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    applied = set(re.findall(r"kubectl apply -k (deploy/\S+)", text))
    assert applied == {f"deploy/kubernetes/{t}" for t in validate.TARGETS}
    for path in re.findall(r"\b(deploy/kubernetes/[\w./-]+\w)", text):
        assert (ROOT / path).exists() or path.endswith("base/passwords.env"), path
    assert validate.KUBERNETES_VERSION.rsplit(".", 1)[0] in text

