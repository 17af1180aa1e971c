"""The deployment examples of docs/deployment.md (deploy/): the Kubernetes manifests and the
compose file valid against their published schemas (shipped by kubernetes-validate and
check-jsonschema: no network), the Dockerfile parsed, and all of them agreeing with the settings
they deploy."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from mdb.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30.0"  # the oldest release still maintained when these were written
# Where the kubelet mounts a pod's service-account token, unless the pod declines it.
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PASSWORD_FILE = Path(tomllib.loads((DEPLOY / "mdb.toml").read_text())
                     ["brokers"]["default"]["password_file"])
# mdb's own source: an application's image has none of it (docs/deployment.md).
MDB_SOURCE = {"mdb", "adapters", "pyproject.toml", "README.md"}

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK",
                "SHELL", "COMMENT"}


def manifests() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes, by kind."""
    found = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """deploy/mdb.toml as a server reads it (its password file made here)."""
    for variable in ("MDB_SERVER", "MDB_HEALTH_PORT", "MDB_HEALTH_HOST"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "mq_password").write_text("secret\n")
    monkeypatch.setenv("MDB_BROKERS__DEFAULT__PASSWORD_FILE", str(tmp_path / "mq_password"))
    return load_settings(DEPLOY / "mdb.toml")


@pytest.mark.parametrize("path", sorted((DEPLOY / "kubernetes").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_each_manifest_is_valid_kubernetes(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_manifest_with_a_misspelt_field_is_refused() -> None:
    statefulset = manifests()["StatefulSet"]
    statefulset["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)


def test_the_compose_file_is_valid_compose() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(DEPLOY / "compose.yaml")], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_manifests_agree_with_the_settings(settings: Settings) -> None:
    objects = manifests()
    assert objects["ConfigMap"]["data"]["mdb.toml"] == (DEPLOY / "mdb.toml").read_text()
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # The kill comes after mdb's own grace period, with time to close.
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_period + 5
    # The probes ask the health endpoint's routes, on its port, which listens beyond localhost.
    [port] = container["ports"]
    assert port["containerPort"] == settings.health_port and settings.health_host == "0.0.0.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready",
                                                      "port": port["name"]}
    # The config and the password are files from the ConfigMap and the Secret.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config = next(n for n, v in volumes.items() if "configMap" in v)
    entrypoint = _entrypoint()
    assert Path(mounts[config]) / "mdb.toml" == Path(entrypoint[entrypoint.index("--config") + 1])
    secret = next(n for n, v in volumes.items() if "secret" in v)
    assert volumes[secret]["secret"]["secretName"] == objects["Secret"]["metadata"]["name"]
    assert PASSWORD_FILE.parent == Path(mounts[secret])
    assert PASSWORD_FILE.name in objects["Secret"]["stringData"]
    # No mount hides, or sits above, the service-account token's directory: on
    # python:3.11-slim /var/run is /run, and a read-only volume at /run/secrets left the
    # kubelet no place for the token (the pod fails to start). The pod needs no token either.
    assert pod["automountServiceAccountToken"] is False
    token = _in_image(SERVICE_ACCOUNT_TOKEN)
    for mount in container["volumeMounts"]:
        path = _in_image(Path(mount["mountPath"]))
        assert path != token and path not in token.parents, mount
    # Stable names: the pods' (orders-0, ...) are their servers' (docs/deployment.md).
    assert objects["StatefulSet"]["spec"]["serviceName"] == objects["Service"]["metadata"]["name"]
    assert "MDB_SERVER" not in {e["name"] for e in container.get("env", ())}


def test_the_compose_file_runs_two_servers_of_one_app(settings: Settings) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    servers = {name: s for name, s in compose["services"].items() if name != "rabbitmq"}
    names = [s["environment"]["MDB_SERVER"] for s in servers.values()]
    assert len(names) == 2 and len(set(names)) == 2
    for name in names:
        Settings(server=name)  # a valid server name
    for server in servers.values():
        [secret] = server["secrets"]
        assert secret["target"] == str(PASSWORD_FILE)
        seconds = float(server["stop_grace_period"].removesuffix("s"))
        assert seconds > settings.shutdown_grace_period + 5
    assert "--workers" not in json.dumps(compose)  # the memory broker is not used either


def _in_image(path: Path) -> Path:
    """``path`` as python:3.11-slim resolves it: its /var/run is a link to /run."""
    return Path("/run", *path.parts[3:]) if path.parts[1:3] == ("var", "run") else path


def _entrypoint() -> list[str]:
    parser = DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    [entrypoint] = [i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT"]
    return list(json.loads(entrypoint))


def test_the_dockerfile_parses_and_copies_what_exists() -> None:
    parser = DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    instructions = parser.structure
    assert {i["instruction"] for i in instructions} <= INSTRUCTIONS
    assert instructions[0]["instruction"] == "COMMENT" and parser.baseimage.startswith("python:3")
    for copy in (i["value"].split() for i in instructions if i["instruction"] == "COPY"):
        if not copy[0].startswith("--from="):  # a file of the build context, not of a stage
            for source in copy[:-1]:
                assert (ROOT / source).exists(), source  # the build context is the repository
    assert _entrypoint()[:2] == ["mdb", "run"]
    [cmd] = [json.loads(i["value"]) for i in instructions if i["instruction"] == "CMD"]
    assert (ROOT / Path(*cmd[0].split("."))).with_suffix(".py").exists()
    assert parser.envs["MDB_HEALTH_PORT"] == "8081"


def test_the_image_is_built_as_an_application_builds_its_own() -> None:
    """docs/deployment.md: an application's Dockerfile is the image's last stage with its own
    package: mdb comes from a wheel, built from this repository's source in a stage of its
    own, as an application's comes from its package index."""
    instructions = DockerfileParser(path=str(DEPLOY / "Dockerfile")).structure
    begins = max(i["startline"] for i in instructions if i["instruction"] == "FROM")
    image = [i for i in instructions if i["startline"] > begins]
    copied = {source.split("/")[0] for copy in image if copy["instruction"] == "COPY"
              and not copy["value"].startswith("--from=")
              for source in copy["value"].split()[:-1]}
    assert not copied & MDB_SOURCE, copied  # the image holds no source of mdb's
    assert copied == {"examples", "deploy"}  # the application and its settings
    installs = [i["value"] for i in image if i["instruction"] == "RUN" and "pip" in i["value"]]
    assert len(installs) == 1 and "mdb-*.whl)[stomp,prometheus]" in installs[0], installs
