"""Renders the Kubernetes overlays and validates every resource, offline.

    python deploy/k8s/manifests.py        (make k8s-validate; tests/unit/deploy runs it too)

Rendering is kustomize's own (the pinned release, built once with ``go install`` into
.local/bin). Kubernetes kinds are checked against the API schemas bundled in the
pinned kubernetes-validate package, strictly (an unknown field is an error), for the
oldest and the newest Kubernetes supported; Strimzi's kinds against the schemas in
schemas/strimzi, made from Strimzi's CRDs by schemas/crd_to_jsonschema.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OVERLAYS = ("local", "production")
KUSTOMIZE_VERSION = "v5.5.0"
# The oldest Kubernetes the manifests support, and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
STRIMZI_GROUP = "kafka.strimzi.io"


class ToolError(Exception):
    """kustomize could not be installed or failed to render."""


def kustomize() -> Path:
    """The pinned kustomize binary, built with Go on first use (the module proxy is
    the only download; the binary's name carries its version, so a bump rebuilds)."""
    binary = REPO / ".local" / "bin" / f"kustomize-{KUSTOMIZE_VERSION}"
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise ToolError(f"kustomize {KUSTOMIZE_VERSION} is not in {binary.parent} and "
                        "there is no `go` to build it: install Go 1.22 or newer")  # fmt: skip
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as gobin:
        module = f"sigs.k8s.io/kustomize/kustomize/v5@{KUSTOMIZE_VERSION}"
        built = subprocess.run(
            [go, "install", module],
            env={**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0"},
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            raise ToolError(f"go install {module} failed:\n{built.stderr.strip()}")
        Path(gobin, "kustomize").rename(binary)
    return binary


def render(overlay: str) -> list[dict[str, Any]]:
    """The resources ``kubectl apply -k deploy/k8s/overlays/<overlay>`` would apply."""
    built = subprocess.run(
        [str(kustomize()), "build", str(HERE / "overlays" / overlay)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise ToolError(f"kustomize build overlays/{overlay} failed:\n{built.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


@cache
def _strimzi_validator(kind: str, version: str) -> jsonschema.Draft7Validator | None:
    path = HERE / "schemas" / "strimzi" / f"{STRIMZI_GROUP}_{kind.lower()}_{version}.json"
    if not path.is_file():
        return None
    return jsonschema.Draft7Validator(json.loads(path.read_text()))


def problems(resource: dict[str, Any]) -> list[str]:
    """What is wrong with one resource; empty when it is valid."""
    group, _, version = str(resource.get("apiVersion", "")).rpartition("/")
    if group == STRIMZI_GROUP:
        validator = _strimzi_validator(str(resource.get("kind")), version)
        if validator is None:
            return [f"no Strimzi schema for {resource.get('kind')} {version} (schemas/strimzi)"]
        return [
            f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
            for error in validator.iter_errors(resource)
        ]
    found = []
    for kubernetes in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(resource, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(map(str, error.path)) or "(root)"
            found.append(f"Kubernetes {kubernetes}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            found.append(f"Kubernetes {kubernetes}: {error.message}")
    return found


def _name(resource: dict[str, Any]) -> str:
    return f"{resource.get('kind')}/{resource.get('metadata', {}).get('name')}"


def check(overlay: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The overlay's resources, and one line per problem found in them."""
    resources = render(overlay)
    return resources, [
        f"overlays/{overlay}: {_name(resource)}: {problem}"
        for resource in resources
        for problem in problems(resource)
    ]


def main() -> int:
    failed = False
    for overlay in OVERLAYS:
        try:
            resources, found = check(overlay)
        except ToolError as error:
            print(f"overlays/{overlay}: {error}", file=sys.stderr)
            return 2
        strimzi = sum(1 for r in resources if str(r.get("apiVersion")).startswith(STRIMZI_GROUP))
        for line in found:
            print(line, file=sys.stderr)
        failed = failed or bool(found)
        print(
            f"overlays/{overlay}: {len(resources)} resources, {len(found)} problems "
            f"({len(resources) - strimzi} Kubernetes, checked against "
            f"{' and '.join(KUBERNETES_VERSIONS)}; {strimzi} Strimzi)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
