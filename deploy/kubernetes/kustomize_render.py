"""Render a kustomization offline, in Python: the subset of Kustomize (v5) that deploy/kubernetes/
uses, for validate.py on machines without kubectl. No maintained Python library renders
kustomizations, so this does, and refuses what it does not implement rather than render it wrong.

Implemented: ``resources`` (YAML files and kustomization folders), ``configMapGenerator`` and
``secretGenerator`` (``literals``, ``files``, ``envs``; ``behavior`` create, replace or merge on a
base's generator), generated names with Kustomize's content hash and every reference to them
renamed, ``patches`` that are strategic-merge patches in a file (target: the patch's kind and name),
``replicas`` and ``images``. Strategic merge as Kubernetes's for the fields used here: maps merge,
``null`` deletes, the lists of containers, initContainers, env, volumes (by ``name``) and
volumeMounts (by ``mountPath``) merge item by item, every other list is replaced.

Where kubectl is installed, ``kubectl kustomize DIR`` renders the same objects (the tests compare).

    python kustomize_render.py DIR     # the rendered objects as a YAML stream
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_KNOWN_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "secretGenerator", "patches",
                 "replicas", "images"}
_GENERATOR_FIELDS = {"name", "behavior", "literals", "files", "envs", "type"}
# strategic-merge keys of the lists that merge item by item (everything else is replaced)
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath"}
SCALABLE_KINDS = ("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it: ~10x faster


class RenderError(ValueError):
    """A kustomization this renderer cannot render (or Kustomize would refuse)."""


@dataclass
class Rendered:
    """The objects of a kustomization, and its generated ConfigMaps and Secrets by (kind, name before hashing)."""
    objects: list[dict[str, Any]] = field(default_factory=list)
    generated: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


# ---------------------------------------------------------------- strategic merge

def strategic_merge(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` merged in (neither is changed), as described in the module docstring."""
    _refuse_directives(patch)
    return _merge(target, patch)


def _refuse_directives(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.startswith("$"):
                raise RenderError(f"strategic-merge directive {key!r} is not implemented here")
            _refuse_directives(item)
    elif isinstance(value, list):
        for item in value:
            _refuse_directives(item)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = _merge_list(merged[key], value, MERGE_KEYS[key], key)
        elif key in merged:
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(target: list[Any], patch: list[Any], merge_key: str, field_name: str) -> list[Any]:
    """Kustomize's order: the patch's items first (merged into the target's of the same key), then
    the target's other items."""
    by_key = {}
    for item in target:
        if isinstance(item, dict) and merge_key in item:
            by_key[item[merge_key]] = item
    merged = []
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise RenderError(f"an item of {field_name} in a patch has no {merge_key!r}: {item!r}")
        if item[merge_key] in by_key:
            merged.append(_merge(by_key[item[merge_key]], item))
        else:
            merged.append(copy.deepcopy(item))
    patched = {item[merge_key] for item in patch}
    return merged + [copy.deepcopy(item) for item in target
                     if not (isinstance(item, dict) and item.get(merge_key) in patched)]


# ---------------------------------------------------------------- generators

def _go_json(value: Any) -> str:
    """JSON as Go's json.Marshal writes it: keys sorted, no spaces, <, > and & escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def name_hash(obj: Mapping[str, Any]) -> str:
    """Kustomize's name suffix of a generated ConfigMap or Secret (api/hasher): the first 10 hex
    digits of the SHA-256 of its kind, data (and type), with 0 1 3 a e spelt g h k m t. Its "name"
    field is always empty: Kustomize looks the name up by a path ("metadata/name") that never matches."""
    fields = {"kind": obj["kind"], "name": "", "data": obj.get("data", "")}
    if obj["kind"] == "Secret":
        fields["type"] = obj.get("type", "")
    extra = "binaryData" if obj["kind"] == "ConfigMap" else "stringData"
    if isinstance(obj.get(extra), dict):  # only when present, as Kustomize
        fields[extra] = obj[extra]
    digest = hashlib.sha256(_go_json(fields).encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (comments and blank lines skipped), as Kustomize's ``envs`` reads them."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise RenderError(f"{path}:{number}: not a KEY=VALUE line")
        values[key.strip()] = value
    return values


def _generator_data(spec: Mapping[str, Any], folder: Path) -> dict[str, str]:
    data: dict[str, str] = {}

    def put(key: str, value: str, where: str) -> None:
        if key in data:
            raise RenderError(f"{where}: key {key!r} twice in generator {spec['name']!r}")
        data[key] = value

    for path in spec.get("envs") or []:
        for key, value in read_env_file(_inside(folder, path)).items():
            put(key, value, path)
    for literal in spec.get("literals") or []:
        key, sep, value = str(literal).partition("=")
        if not sep:
            raise RenderError(f"literal {literal!r} of generator {spec['name']!r} is not KEY=VALUE")
        put(key, value, "literals")
    for entry in spec.get("files") or []:
        key, sep, path = str(entry).partition("=")
        if not sep:
            key, path = Path(entry).name, entry
        put(key, _inside(folder, path).read_text(), str(entry))
    return data


def _generated(kind: str, spec: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    unknown = set(spec) - _GENERATOR_FIELDS
    if unknown or "name" not in spec:
        raise RenderError(f"{folder}: generator {spec.get('name')!r}: fields {sorted(unknown)} not implemented "
                          "here (or no name)")
    data = _generator_data(spec, folder)
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}}
    if kind == "Secret":
        obj["type"] = spec.get("type", "Opaque")
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    return obj


# ---------------------------------------------------------------- references to generated names

def _pod_specs(obj: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        yield spec
    elif obj.get("kind") == "CronJob":
        yield ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
    elif isinstance(spec.get("template"), dict):
        yield spec["template"].get("spec") or {}


def name_references(pod: Mapping[str, Any]) -> Iterable[tuple[str, dict[str, Any], str]]:
    """(kind, the dict holding the name, its key) of every ConfigMap and Secret a pod spec names."""
    for volume in pod.get("volumes") or []:
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"], "name"
        if "secret" in volume:
            yield "Secret", volume["secret"], "secretName"
        for source in (volume.get("projected") or {}).get("sources") or []:
            for key, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
                if key in source:
                    yield kind, source[key], "name"
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for env in container.get("env") or []:
            source = env.get("valueFrom") or {}
            if "configMapKeyRef" in source:
                yield "ConfigMap", source["configMapKeyRef"], "name"
            if "secretKeyRef" in source:
                yield "Secret", source["secretKeyRef"], "name"
        for env_from in container.get("envFrom") or []:
            if "configMapRef" in env_from:
                yield "ConfigMap", env_from["configMapRef"], "name"
            if "secretRef" in env_from:
                yield "Secret", env_from["secretRef"], "name"
    for pull in pod.get("imagePullSecrets") or []:
        yield "Secret", pull, "name"


def _finish_generated(rendered: Rendered) -> list[dict[str, Any]]:
    """The objects with generated names hashed and every reference to them renamed."""
    renames = {}
    objects = copy.deepcopy(rendered.objects)
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in rendered.generated:
            renames[key] = f"{key[1]}-{name_hash(obj)}"
            obj["metadata"]["name"] = renames[key]
    for obj in objects:
        for pod in _pod_specs(obj):
            for kind, holder, key in name_references(pod):
                holder[key] = renames.get((kind, holder.get(key)), holder.get(key))
    return objects


# ---------------------------------------------------------------- the kustomization

def _inside(folder: Path, relative: str) -> Path:
    path = (folder / relative).resolve()
    if not path.exists():
        raise RenderError(f"{folder}: {relative} does not exist")
    return path


def kustomization_file(folder: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (folder / name).is_file():
            return folder / name
    raise RenderError(f"{folder} has no kustomization.yaml")


def _find(objects: list[dict[str, Any]], kind: str, name: str, where: str) -> dict[str, Any]:
    found = [o for o in objects if o.get("kind") == kind and (o.get("metadata") or {}).get("name") == name]
    if len(found) != 1:
        raise RenderError(f"{where}: {len(found)} {kind} objects named {name!r} (need exactly one)")
    return found[0]


def _set_image(image: str, rule: Mapping[str, Any]) -> str | None:
    """``image`` changed by an ``images`` rule, or None when the rule is for another image."""
    name, at, digest = image.partition("@")
    repository, colon, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    if repository != rule.get("name"):
        return None
    repository = rule.get("newName", repository)
    if "digest" in rule:
        return f"{repository}@{rule['digest']}"
    if "newTag" in rule:
        return f"{repository}:{rule['newTag']}"
    return repository + (f"{colon}{tag}" if colon else "") + (f"{at}{digest}" if at else "")


def _render(folder: Path, visiting: tuple[Path, ...]) -> Rendered:
    folder = folder.resolve()
    if folder in visiting:
        raise RenderError(f"{folder}: a kustomization includes itself")
    path = kustomization_file(folder)
    kustomization = yaml.load(path.read_text(), Loader=_LOADER) or {}
    unknown = set(kustomization) - _KNOWN_FIELDS
    if unknown:
        raise RenderError(f"{path}: {', '.join(sorted(unknown))} not implemented here")
    rendered = Rendered()
    for entry in kustomization.get("resources") or []:
        target = _inside(folder, entry)
        if target.is_dir():
            below = _render(target, (*visiting, folder))
            rendered.objects += below.objects
            rendered.generated.update(below.generated)
        else:
            rendered.objects += [doc for doc in yaml.load_all(target.read_text(), Loader=_LOADER) if doc is not None]
    for kind, generators in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for spec in kustomization.get(generators) or []:
            obj = _generated(kind, spec, folder)
            behavior = spec.get("behavior", "create")
            key = (kind, spec["name"])
            if behavior == "create":
                if key in rendered.generated:
                    raise RenderError(f"{path}: {kind} {spec['name']!r} is generated twice (use behavior: replace or merge)")
                rendered.objects.append(obj)
                rendered.generated[key] = obj
            elif behavior in ("replace", "merge"):
                if key not in rendered.generated:
                    raise RenderError(f"{path}: behavior {behavior} for {kind} {spec['name']!r}, which no base generates")
                existing = rendered.generated[key]
                existing["data"] = obj["data"] if behavior == "replace" else {**existing.get("data", {}), **obj["data"]}
            else:
                raise RenderError(f"{path}: behavior {behavior!r} of {spec['name']!r} (use create, replace or merge)")
    for patch in kustomization.get("patches") or []:
        if set(patch) != {"path"}:
            raise RenderError(f"{path}: only patches with a path (a strategic-merge patch) are implemented here, "
                              f"got {sorted(patch)}")
        patch_doc = yaml.load(_inside(folder, patch["path"]).read_text(), Loader=_LOADER)
        if not isinstance(patch_doc, dict) or "kind" not in patch_doc or "name" not in (patch_doc.get("metadata") or {}):
            raise RenderError(f"{patch['path']}: a strategic-merge patch needs kind and metadata.name")
        target = _find(rendered.objects, patch_doc["kind"], patch_doc["metadata"]["name"], patch["path"])
        merged = strategic_merge(target, {k: v for k, v in patch_doc.items() if k != "apiVersion"})
        target.clear()
        target.update(merged)
    for rule in kustomization.get("replicas") or []:
        matches = [o for o in rendered.objects if o.get("kind") in SCALABLE_KINDS
                   and o["metadata"]["name"] == rule.get("name")]
        if not matches or not isinstance(rule.get("count"), int):
            raise RenderError(f"{path}: replicas {rule!r}: no workload of that name, or count is not a whole number")
        for obj in matches:
            obj["spec"]["replicas"] = rule["count"]
    for rule in kustomization.get("images") or []:
        for obj in rendered.objects:
            for pod in _pod_specs(obj):
                for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
                    changed = _set_image(str(container.get("image", "")), rule)
                    if changed is not None:
                        container["image"] = changed
    return rendered


def render(folder: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize FOLDER`` gives (in the order of the kustomizations, not
    sorted by kind). Raises RenderError for what is not implemented or would not render."""
    rendered = _render(Path(folder), ())
    # a generator's object is the same dict in objects and generated until the names are finished
    return _finish_generated(rendered)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.exit("usage: python kustomize_render.py DIR")
    try:
        objects = render(Path(argv[0]))
    except RenderError as exc:
        sys.exit(f"render: {exc}")
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
