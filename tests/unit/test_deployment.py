"""The deployment files `mdb deploy-files` writes (docs/deployment.md), for an application of
a project of the test's own: the Kubernetes manifests and the compose files valid against
their published schemas (shipped by kubernetes-validate and check-jsonschema: no network), the
Dockerfiles parsed, all of them agreeing with the settings they deploy, and the command's
refusals."""

from __future__ import annotations

import importlib.metadata
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

from mdb.commands import deployment as written_by
from mdb.config.settings import Settings, load_settings
from tests.harness.processes.cli import mdb, one_line

KUBERNETES_VERSION = "1.30.0"  # the oldest release still maintained when these were written
# Where the kubelet mounts a pod's service-account token, unless the pod declines it.
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TEMPLATES = Path(written_by.__file__).parent
DEPLOYMENTS = sorted(p.parent.name for p in TEMPLATES.glob("*/mdb.toml"))
MANIFESTS = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.glob("*/kubernetes/*.yaml"))
MODULE = "shop.listeners"

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK",
                "SHELL", "COMMENT"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose listeners are ``shop.listeners``, with ``mdb deploy-files deploy
    shop.listeners`` run at its root, as the docs say."""
    root = tmp_path_factory.mktemp("project")
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "listeners.py").write_text("from mdb import listener\n")
    written = mdb("deploy-files", "deploy", MODULE, cwd=root)
    assert written.returncode == 0, written.stderr
    return root


def manifests(project: Path, deployment: str) -> dict[str, dict[str, Any]]:
    """Every Kubernetes object of a deployment, by kind."""
    found = {}
    for path in sorted((project / "deploy" / deployment / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


def password_files(project: Path, deployment: str) -> list[Path]:
    """The secret files a deployment's settings read: its brokers' and its databases'."""
    settings = tomllib.loads((project / "deploy" / deployment / "mdb.toml").read_text())
    sections = [*settings["brokers"].values(), *settings.get("databases", {}).values()]
    return [Path(section["password_file"]) for section in sections]


def settings_of(project: Path, deployment: str, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A deployment's mdb.toml as a server reads it (its password files made here)."""
    for variable in ("MDB_SERVER", "MDB_HEALTH_PORT", "MDB_HEALTH_HOST"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "password").write_text("secret\n")
    path = project / "deploy" / deployment / "mdb.toml"
    for section in ("brokers", "databases"):
        for name in tomllib.loads(path.read_text()).get(section, {}):
            monkeypatch.setenv(f"MDB_{section.upper()}__{name.upper()}__PASSWORD_FILE",
                               str(tmp_path / "password"))
    return load_settings(path)


def test_every_template_is_written_with_nothing_left_to_fill(project: Path) -> None:
    written = {p.relative_to(project / "deploy") for p in (project / "deploy").rglob("*")
               if p.is_file()}
    templates = {p.relative_to(TEMPLATES) for p in TEMPLATES.rglob("*")
                 if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert written == templates | {Path("exactly-once/activemq.xml")}
    for path in written:
        assert "{{" not in (project / "deploy" / path).read_text(), path


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_each_manifest_is_valid_kubernetes(project: Path, manifest: str) -> None:
    for document in yaml.safe_load_all((project / "deploy" / manifest).read_text()):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_manifest_with_a_misspelt_field_is_refused(project: Path) -> None:
    statefulset = manifests(project, "rabbitmq")["StatefulSet"]
    statefulset["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_the_compose_file_is_valid_compose(project: Path, deployment: str) -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(project / "deploy" / deployment / "compose.yaml")],
        capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_the_manifests_agree_with_the_settings(
        project: Path, deployment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_of(project, deployment, tmp_path, monkeypatch)
    objects = manifests(project, deployment)
    assert objects["ConfigMap"]["data"]["mdb.toml"] == (
        project / "deploy" / deployment / "mdb.toml").read_text()
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"][0] == MODULE
    # The kill comes after mdb's own grace period, with time to close.
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_period + 5
    # The probes ask the health endpoint's routes, on its port, which listens beyond localhost.
    [port] = container["ports"]
    assert port["containerPort"] == settings.health_port and settings.health_host == "0.0.0.0"
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready",
                                                      "port": port["name"]}
    # The config and the passwords are files from the ConfigMap and the Secret.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config = next(n for n, v in volumes.items() if "configMap" in v)
    assert volumes[config]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    assert Path(mounts[config]) / "mdb.toml" == _settings_path(project)
    secret = next(n for n, v in volumes.items() if "secret" in v)
    assert volumes[secret]["secret"]["secretName"] == objects["Secret"]["metadata"]["name"]
    for password_file in password_files(project, deployment):
        assert password_file.parent == Path(mounts[secret])
        assert password_file.name in objects["Secret"]["stringData"]
    # No mount hides, or sits above, the service-account token's directory: on
    # python:3.11-slim /var/run is /run, and a read-only volume at /run/secrets left the
    # kubelet no place for the token (the pod fails to start). The pod needs no token either.
    assert pod["automountServiceAccountToken"] is False
    token = _in_image(SERVICE_ACCOUNT_TOKEN)
    for mount in container["volumeMounts"]:
        path = _in_image(Path(mount["mountPath"]))
        assert path != token and path not in token.parents, mount
    # Stable names: the pods' ({{name}}-0, ...) are their servers' (docs/deployment.md).
    assert objects["StatefulSet"]["spec"]["serviceName"] == objects["Service"]["metadata"]["name"]
    assert "MDB_SERVER" not in {e["name"] for e in container.get("env", ())}


def test_on_kubernetes_each_pod_makes_mdbs_tables_before_its_servers_start(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_of(project, "exactly-once", tmp_path, monkeypatch).databases
    pod = manifests(project, "exactly-once")["StatefulSet"]["spec"]["template"]["spec"]
    [container], [upgrade] = pod["containers"], pod["initContainers"]
    assert upgrade["image"] == container["image"]
    assert upgrade["command"] == ["mdb", "db", "upgrade", "--config", str(_settings_path(project))]
    assert upgrade["volumeMounts"] == container["volumeMounts"]  # the settings and secrets
    assert "initContainers" not in manifests(project, "rabbitmq")["StatefulSet"]["spec"][
        "template"]["spec"]  # no database to upgrade


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_the_compose_file_runs_two_servers_of_one_app(
        project: Path, deployment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compose = _compose(project, deployment)
    servers = {name: s for name, s in compose["services"].items() if name.startswith("server")}
    names = [s["environment"]["MDB_SERVER"] for s in servers.values()]
    assert len(names) == 2 and len(set(names)) == 2
    for name in names:
        Settings(server=name)  # a valid server name
    settings = settings_of(project, deployment, tmp_path, monkeypatch)
    for server in servers.values():
        assert {s["target"] for s in server["secrets"]} == {
            str(p) for p in password_files(project, deployment)}
        [config] = server["configs"]
        assert Path(config["target"]) == _settings_path(project)
        assert compose["configs"][config["source"]]["file"] == "./mdb.toml"
        seconds = float(server["stop_grace_period"].removesuffix("s"))
        assert seconds > settings.shutdown_grace_period + 5
        # The image of the project's root, from the compose file's folder.
        build = project / "deploy" / deployment / server["build"]["context"]
        assert build.resolve() == project.resolve()
        assert (build / server["build"]["dockerfile"]).resolve() == project / "deploy/Dockerfile"
    assert "--workers" not in json.dumps(compose)  # the memory broker is not used either


def test_in_compose_the_servers_start_once_the_tables_are_made(project: Path) -> None:
    services = _compose(project, "exactly-once")["services"]
    upgrade = services["upgrade"]
    assert upgrade["entrypoint"] == ["mdb", "db", "upgrade", "--config",
                                     str(_settings_path(project))]
    assert upgrade["depends_on"]["mariadb"] == {"condition": "service_healthy"}
    for name in ("server_1", "server_2"):
        assert services[name]["depends_on"]["upgrade"] == {
            "condition": "service_completed_successfully"}
        assert services[name]["secrets"] == upgrade["secrets"]
    # MariaDB as mdb needs it: the database of the settings, and room for an outbox row.
    url = tomllib.loads((project / "deploy/exactly-once/mdb.toml").read_text())[
        "databases"]["main"]["url"]
    assert url.endswith(f"/{services['mariadb']['environment']['MARIADB_DATABASE']}")
    assert "--max-allowed-packet=256M" in services["mariadb"]["command"]


def test_the_images_dockerfile_copies_the_project_and_runs_its_module(project: Path) -> None:
    parser = DockerfileParser(path=str(project / "deploy" / "Dockerfile"))
    instructions = parser.structure
    assert {i["instruction"] for i in instructions} <= INSTRUCTIONS
    assert parser.baseimage.startswith("python:3")
    copied = [i["value"].split() for i in instructions if i["instruction"] == "COPY"]
    assert copied == [["shop", "./shop"]]  # the application alone: mdb comes from its index
    assert _entrypoint(project / "deploy" / "Dockerfile")[:2] == ["mdb", "run"]
    [cmd] = [json.loads(i["value"]) for i in instructions if i["instruction"] == "CMD"]
    assert cmd == [MODULE]
    [install] = [i["value"] for i in instructions if i["instruction"] == "RUN" and "pip" in
                 i["value"]]
    assert f"]=={importlib.metadata.version('mdb')}'" in install  # pinned
    assert parser.envs["MDB_HEALTH_PORT"] == "8081"


def test_the_brokers_dockerfile_runs_the_reference_config_with_mdbs_login(project: Path) -> None:
    folder = project / "deploy" / "exactly-once"
    parser = DockerfileParser(path=str(folder / "activemq.Dockerfile"))
    assert {i["instruction"] for i in parser.structure} <= INSTRUCTIONS
    for copy in (i["value"].split() for i in parser.structure if i["instruction"] == "COPY"):
        for source in copy[:-1]:
            assert (folder / source).is_file(), source  # its build context is its folder
    entrypoint = _entrypoint(folder / "activemq.Dockerfile")
    conf = next(a.split("=", 1)[1] for a in entrypoint if a.startswith("-Dactivemq.conf="))
    activemq = _compose(project, "exactly-once")["services"]["activemq"]
    [credentials] = activemq["secrets"]
    assert Path(credentials["target"]) == Path(conf) / "credentials.properties"
    assert entrypoint[-1] == f"xbean:file:{conf}/activemq.xml"
    assert "mdb.password" in (folder / "activemq.xml").read_text()


def test_files_written_before_are_kept_unless_forced(project: Path) -> None:
    settings = project / "deploy" / "rabbitmq" / "mdb.toml"
    settings.write_text("# mine\n")
    again = mdb("deploy-files", "deploy", MODULE, cwd=project)
    assert again.returncode == 2
    assert "exists" in one_line(again.stderr) and "--force" in one_line(again.stderr)
    assert settings.read_text() == "# mine\n"
    forced = mdb("deploy-files", "deploy", MODULE, "--force", cwd=project)
    assert forced.returncode == 0, forced.stderr
    assert "wrote deploy/rabbitmq/mdb.toml" in forced.stdout.decode().splitlines()
    assert settings.read_text().startswith("# The settings every server of shop reads")


@pytest.mark.parametrize(("args", "says"), [
    (["elsewhere", "nowhere.listeners"], "no nowhere/listeners/ or nowhere/listeners.py"),
    (["elsewhere", "shop.nothere"], "no shop/nothere/ or shop/nothere.py"),  # its package there
    (["elsewhere", MODULE, "--app", "_shop_"], "makes no Kubernetes name"),
    (["elsewhere", MODULE, "--app", "my-shop"], "may contain only letters"),
])
def test_a_bad_argument_is_one_line_exit_2_and_nothing_written(
        project: Path, args: list[str], says: str) -> None:
    refused = mdb("deploy-files", *args, cwd=project)
    assert refused.returncode == 2 and says in one_line(refused.stderr)
    assert not (project / "elsewhere").exists()


def _compose(project: Path, deployment: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (project / "deploy" / deployment / "compose.yaml").read_text())
    return loaded


def _settings_path(project: Path) -> Path:
    """Where the image's entrypoint reads the settings from (``mdb run --config``)."""
    entrypoint = _entrypoint(project / "deploy" / "Dockerfile")
    return Path(entrypoint[entrypoint.index("--config") + 1])


def _in_image(path: Path) -> Path:
    """``path`` as python:3.11-slim resolves it: its /var/run is a link to /run."""
    return Path("/run", *path.parts[3:]) if path.parts[1:3] == ("var", "run") else path


def _entrypoint(dockerfile: Path) -> list[str]:
    parser = DockerfileParser(path=str(dockerfile))
    [entrypoint] = [i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT"]
    return list(json.loads(entrypoint))
