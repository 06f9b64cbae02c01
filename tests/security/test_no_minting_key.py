"""No node agent, projector or console holds what it takes to mint a user's or an
operator's token.

Each of them is configured as each deployment configures it: the Kubernetes base
manifests (their environment, and every Secret and ConfigMap they mount), the integration
tests' ``Stack``, and ``deploy/local/stack.sh`` (``make up``). Every environment value it
is given, and every file those name or mount, is key material for an attacker who owns
that service: taken as an HMAC secret, and as a private key wherever it holds one
(``tests/forgery.py``). Every token so made for alice and for the root's budget manager
must be refused by admission's and budget's verifiers, each set up from its own
configuration in the same deployment.

The check can fail: the same procedure, given the user-token issuer's key, mints tokens
that both verifiers accept; and from the console's own files it mints an accepted token
for ``svc-console`` (its own identity), so its key is among what is tried.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.auth import AuthError, Keys, load_keys, verify_token
from libs.auth.keygen import ISSUER, PUBLIC_KEYS, keygen
from libs.bus.writers import SERVICE_ROLES
from libs.trust.install import init as init_trust
from tests.forgery import claims, forgeries
from tests.integration.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s" / "base"
STACK_SH = ROOT / "deploy" / "local" / "stack.sh"
sys.path.insert(0, str(ROOT / "deploy" / "local"))
import certs  # noqa: E402

HOLDERS = ("node-agent", "projector", "console")  # must hold nothing that mints
VERIFIERS = ("admission", "budget")
MAX_FILE_BYTES = 1 << 20


@dataclass
class Service:
    """What a service's configuration gives it: its environment, and the files (by path)
    that its settings name or that are mounted into it."""

    env: dict[str, str]
    files: dict[str, bytes]

    def material(self) -> Iterator[tuple[str, bytes]]:
        for name, value in sorted(self.env.items()):
            yield f"${name}", value.encode()
        yield from sorted(self.files.items())


@dataclass
class Installation:
    name: str
    services: dict[str, Service]  # by the service's name, dashed
    verifiers: dict[str, Keys]
    issuer_key: bytes  # the user-token issuer's private key file (the operators')
    root_managers: tuple[str, ...]


def root_managers(budget_file: Path) -> tuple[str, ...]:
    managers = tuple(yaml.safe_load(budget_file.read_text())["managers"])
    assert managers, budget_file
    return managers


def files_named(env: Mapping[str, str], args: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file an environment value (or an argument) names: a file, or each file in a
    folder it names (recursively)."""
    found: dict[str, bytes] = {}
    for value in (*env.values(), *args):
        path = Path(value) if os.path.isabs(value) else ROOT / value
        if not value or not path.exists() or ROOT.is_relative_to(path):
            continue  # (the working directory is no setting)
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file() and not file.is_symlink() and file.stat().st_size <= MAX_FILE_BYTES:
                found[str(file)] = file.read_bytes()
    return found


def minted(
    material: bytes,
    users: tuple[str, ...],
    verifiers: Mapping[str, Keys],
    verify: Callable[[str, Keys], str] = verify_token,
) -> Iterator[tuple[str, str, str]]:
    """(user, verifier, how) for each token made from ``material`` that a verifier takes
    for ``user``."""
    for user in users:
        for verifier, keys in verifiers.items():
            kids = [key.kid for key in keys.public]
            payload = claims(user, keys.issuer, keys.audience)
            for how, token in forgeries(material, payload, kids):
                try:
                    accepted = verify(token, keys)
                except AuthError:
                    continue
                assert accepted == user
                yield user, verifier, how


# --- the deployments ------------------------------------------------------------------


def make_keys(folder: Path) -> Path:
    """The installation's token keys, as its operator makes them."""
    keygen(folder / "auth")
    certs.make(folder / "tls")
    return folder / "auth"


def kubernetes(tmp: Path) -> Installation:
    """The base manifests, with the Secrets and ConfigMaps the operator adds
    (deploy/k8s/README.md): the token keys keygen makes, the event log's keys, a TLS
    certificate, passwords."""
    auth = make_keys(tmp)
    tls = tmp / "tls"
    config_maps = generated_config_maps()
    assert "public-keys.yaml" in config_maps["qm-auth-public-keys"]
    config_maps["qm-auth-public-keys"]["public-keys.yaml"] = (auth / PUBLIC_KEYS).read_bytes()
    tls_files = {
        "tls.crt": (tls / "server.crt").read_bytes(),
        "tls.key": (tls / "server.key").read_bytes(),
        "ca.crt": (tls / "ca.crt").read_bytes(),
    }
    secrets_: dict[str, dict[str, bytes]] = {
        "qm-auth-admission": {"signing.key": (auth / "admission.key").read_bytes()},
        "qm-auth-console": {"signing.key": (auth / "console.key").read_bytes()},
        "qm-grpc-tls": tls_files,
        "qm-kafka-cluster-ca-cert": {"ca.crt": tls_files["ca.crt"]},
        "qm-task-secrets": {"alice.HF_TOKEN": b"hf_" + secrets.token_hex(16).encode()},
    }
    # The event log's keys (libs.trust): the trust file and each writer's own key.
    trust_file = init_trust(tmp / "trust")
    config_maps["qm-trust"]["trust.yaml"] = trust_file.read_bytes()
    for role in SERVICE_ROLES:
        secrets_[f"qm-events-{role}"] = {
            "events.key": (trust_file.parent / f"{role}.key").read_bytes()
        }
    for user in kafka_users():  # Strimzi's Secret of each KafkaUser
        secrets_[user] = {"password": secrets.token_urlsafe(24).encode()}
    services = {
        name: pod(tmp / "pods" / name, name, config_maps, secrets_)
        for name in (*HOLDERS, *VERIFIERS)
    }
    verifiers = {
        name: load_keys(in_pod(tmp / "pods" / name, services[name].env)) for name in VERIFIERS
    }
    return Installation(
        "kubernetes",
        services,
        verifiers,
        (auth / f"{ISSUER}.key").read_bytes(),
        root_managers(BASE / "config" / "budget.yaml"),
    )


def generated_config_maps() -> dict[str, dict[str, bytes]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    maps: dict[str, dict[str, bytes]] = {}
    for generator in kustomization["configMapGenerator"]:
        data = maps.setdefault(generator["name"], {})
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value.encode()
        for entry in generator.get("files", []):
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (BASE / path).read_bytes()
    return maps


def kafka_users() -> list[str]:
    documents = yaml.safe_load_all((BASE / "kafka" / "topics-and-users.yaml").read_text())
    return [d["metadata"]["name"] for d in documents if d and d["kind"] == "KafkaUser"]


def pod(
    root: Path,
    name: str,
    config_maps: Mapping[str, Mapping[str, bytes]],
    secrets_: Mapping[str, Mapping[str, bytes]],
) -> Service:
    """The environment and files of workload ``name``'s container, its mounted volumes
    written under ``root`` (the container's /)."""
    [workload] = [
        d for d in yaml.safe_load_all((BASE / f"{name}.yaml").read_text())
        if d and d["kind"] in ("Deployment", "DaemonSet")
    ]  # fmt: skip
    spec = workload["spec"]["template"]["spec"]
    [container] = spec["containers"]

    def source(ref: Mapping[str, Any], kind: str) -> Mapping[str, bytes]:
        known = config_maps if kind == "configMap" else secrets_
        ref_name = ref["name"] if kind == "configMap" else ref["secretName"]
        if ref_name not in known:
            if ref.get("optional"):
                return {}
            pytest.fail(
                f"{name} mounts {kind} {ref_name}, which this test does not know: add what "
                "it holds, so that it is tried as key material"
            )
        return known[ref_name]

    env: dict[str, str] = {}
    for entry in container.get("envFrom", []):
        if "configMapRef" in entry:
            data = config_maps[entry["configMapRef"]["name"]]
        else:
            data = secrets_[entry["secretRef"]["name"]]
        env |= {key: value.decode() for key, value in data.items()}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]
        if "fieldRef" in ref:  # the pod's own name and address
            continue
        if "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            env[entry["name"]] = secrets_[key["name"]][key["key"]].decode()
        else:
            key = ref["configMapKeyRef"]
            env[entry["name"]] = config_maps[key["name"]][key["key"]].decode()
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    files: dict[str, bytes] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        kind = next((k for k in ("configMap", "secret") if k in volume), None)
        if kind is None:  # emptyDir, hostPath, a claim: nothing in them at the start
            continue
        data = source(volume[kind], kind)
        items = volume[kind].get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            path = f"{mount['mountPath']}/{item['path']}"
            files[path] = data[item["key"]]
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).write_bytes(data[item["key"]])
    return Service(env, files)


def in_pod(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each absolute path that is mounted read from under ``root``."""
    return {
        key: str(root / value.lstrip("/")) if (root / value.lstrip("/")).exists() else value
        for key, value in env.items()
        if key.startswith("QM_")
    }


def integration_stack(tmp: Path) -> Iterator[Installation]:
    """The integration tests' ``Stack``: each service as ``Stack.start`` runs it."""
    users = tmp / "users"
    users.mkdir()
    for user in (*kafka_users(), "admin", "console"):
        (users / user).write_text(secrets.token_urlsafe(24))
    stack = Stack(tmp / "stack", users_dir=users)
    try:

        def given(module: str) -> dict[str, str]:
            env = stack.service_env(module)
            return {k: v for k, v in env.items() if os.environ.get(k) != v}

        services = {}
        for name in HOLDERS:
            env = given(name.replace("-", "_"))
            services[name] = Service(env, files_named(env))
        verifiers = {name: load_keys(stack.service_env(name)) for name in VERIFIERS}
        yield Installation(
            "the integration Stack",
            services,
            verifiers,
            Path(stack.env["QM_AUTH_SIGNING_KEY_FILE"]).read_bytes(),
            tuple(stack_budget_managers()),
        )
    finally:
        for folder in (stack.scratch, stack.checkpoints, stack.datasets):
            shutil.rmtree(folder, ignore_errors=True)


def stack_budget_managers() -> list[str]:
    from tests.integration.stack import BUDGET_TREE

    return list(BUDGET_TREE["managers"])  # type: ignore[call-overload]


# Runs stack.sh's start_service lines (those of up()) with a stand-in for nohup first on
# the PATH, which starts nothing: it writes the environment and the arguments each
# service would start with. Nothing runs Python ($py is a path that does not exist).
HARNESS = r"""
exit() { return 0; }  # stack.sh ends in its usage message
source "$STACK_SH" probe 2>/dev/null
unset -f exit
run="$OUT/run" logs="$OUT/logs" py=/nonexistent/python
mkdir -p "$run" "$logs"
"""
BASH_OWN = {"PWD", "OLDPWD", "SHLVL", "_"}
FAKE_NOHUP = """#!/bin/sh
started=$(mktemp "$OUT/started.XXXXXX")
env -0 > "$started.env"
printf '%s\\0' "$@" > "$started.args"
"""


@cache
def start_lines() -> tuple[str, ...]:
    text = STACK_SH.read_text()
    up = text.split("\nup() {\n", 1)[1].split("\n}\n", 1)[0]
    lines = tuple(
        line.strip() for line in up.splitlines()
        if re.match(r"\s*([A-Z_]+=\S+\s+)*start_service\s", line)
    )  # fmt: skip
    return lines


def local_stack(tmp: Path) -> Installation:
    """``make up``: each service with the environment and arguments deploy/local/stack.sh
    starts it with, its state folder (.local) as ``make up`` makes it, here in ``tmp``."""
    state = tmp / "local"
    auth = make_keys(state)
    assert auth == state / "auth"
    users = state / "kafka" / "users"
    users.mkdir(parents=True)
    for user in (*kafka_users(), "admin"):
        (users / user).write_text(secrets.token_urlsafe(24))
    out, bin_ = tmp / "out", tmp / "bin"
    out.mkdir()
    bin_.mkdir()
    (bin_ / "nohup").write_text(FAKE_NOHUP)
    (bin_ / "nohup").chmod(0o755)
    script = HARNESS + "\n".join(start_lines()) + "\nwait\n"
    harness = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp), "STACK_SH": str(STACK_SH),
               "OUT": str(out)}  # fmt: skip
    subprocess.run(["bash", "-c", script], env=harness, check=True, timeout=60)
    local = str(ROOT / ".local")
    starts: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {}
    for record in out.glob("started.*.args"):
        args = record.read_bytes().decode().split("\0")[:-1]
        module = args[args.index("-m") + 1].removeprefix("services.")
        raw = record.with_suffix(".env").read_bytes().decode()
        env = dict(entry.split("=", 1) for entry in raw.split("\0") if "=" in entry)
        env = {
            k: v.replace(local, str(state)) for k, v in env.items()
            if k not in harness and k not in BASH_OWN
        }  # fmt: skip
        starts[module] = env, tuple(args[args.index("-m") + 2 :])

    def started(module: str) -> tuple[dict[str, str], tuple[str, ...]]:
        return starts[module]

    services = {}
    for name in HOLDERS:
        env, args = started(name.replace("-", "_"))
        services[name] = Service(env, files_named(env, args))
    verifiers = {name: load_keys(started(name)[0]) for name in VERIFIERS}
    return Installation(
        "deploy/local/stack.sh",
        services,
        verifiers,
        (auth / f"{ISSUER}.key").read_bytes(),
        root_managers(ROOT / "deploy" / "local" / "budget.yaml"),
    )


@pytest.fixture(scope="module", params=["kubernetes", "integration", "local"])
def installation(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "kubernetes":
        yield kubernetes(tmp)
    elif request.param == "integration":
        yield from integration_stack(tmp)
    else:
        yield local_stack(tmp)


# --- the checks -----------------------------------------------------------------------


def test_stack_sh_starts_every_service_this_test_reads() -> None:
    started = {line.split("start_service", 1)[1].split()[0] for line in start_lines()}
    assert {"node_agent", "projector", "console", "admission", "budget"} <= started


def test_the_verifiers_are_the_services_own(installation: Installation) -> None:
    """Each verifier holds the installation's three public keys, and the holders were
    given something (the check below is not vacuous)."""
    for keys in installation.verifiers.values():
        assert sorted(key.name for key in keys.public) == ["admission", "console", "issuer"]
        assert keys.oidc is None
    for name, service in installation.services.items():
        assert service.env and service.files, name
        assert any(key.endswith(PUBLIC_KEYS) for key in service.files) or any(
            b"BEGIN PUBLIC KEY" in content for content in service.files.values()
        ), f"{name} has no public keys"


@pytest.mark.parametrize("holder", HOLDERS)
def test_nothing_a_service_holds_mints_a_users_or_a_managers_token(
    installation: Installation, holder: str
) -> None:
    users = ("alice", *installation.root_managers)
    service = installation.services[holder]
    accepted = [
        f"{label}: {how} -> a token for {user} that {verifier} accepts"
        for label, material in service.material()
        for user, verifier, how in minted(material, users, installation.verifiers)
    ]
    assert accepted == [], f"{installation.name}, {holder}:\n" + "\n".join(accepted)


def test_the_same_procedure_mints_from_the_issuers_key(installation: Installation) -> None:
    """Self-check: the user-token issuer's key (the operators', held by no service) does
    mint tokens that both verifiers accept, for every user tried."""
    users = ("alice", *installation.root_managers)
    accepted = set(
        (user, verifier)
        for user, verifier, _ in minted(installation.issuer_key, users, installation.verifiers)
    )
    assert accepted == {(user, verifier) for user in users for verifier in VERIFIERS}


def test_the_console_s_own_key_is_found_and_signs_for_the_console_only(
    installation: Installation,
) -> None:
    """Self-check: among the console's material is its own key, which the procedure
    finds and uses: its svc-console tokens are accepted (they are the console's own)."""
    console = installation.services["console"]
    accepted = {
        (label, verifier)
        for label, material in console.material()
        for _, verifier, _ in minted(material, ("svc-console",), installation.verifiers)
    }
    assert {verifier for _, verifier in accepted} == set(VERIFIERS)
    assert all("console.key" in label or "signing.key" in label for label, _ in accepted)


def confused(token: str, keys: Keys) -> str:
    """A verifier with the classic flaw: an HS256 token is checked with the named key's
    PEM as the HMAC secret."""
    header, payload, signature = token.split(".")
    head = json.loads(base64.urlsafe_b64decode(header + "=="))
    key = keys.by_id(head.get("kid"))
    if head.get("alg") != "HS256" or key is None:
        return verify_token(token, keys)
    mac = hmac.new(key.pem().encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    if base64.urlsafe_b64encode(mac).rstrip(b"=").decode() != signature:
        raise AuthError("signature does not match")
    return str(json.loads(base64.urlsafe_b64decode(payload + "=="))["sub"])


@pytest.mark.parametrize("holder", HOLDERS)
def test_the_procedure_would_catch_a_verifier_open_to_algorithm_confusion(
    installation: Installation, holder: str
) -> None:
    """Self-check: against a verifier that takes an HS256 token's key's PEM (public, held
    by every service) as its HMAC secret, each holder's material does mint a token."""
    users = ("alice", *installation.root_managers)
    service = installation.services[holder]
    assert any(
        True
        for _, material in service.material()
        for _ in minted(material, users, installation.verifiers, confused)
    )
