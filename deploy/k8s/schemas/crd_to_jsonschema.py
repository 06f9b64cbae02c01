"""Strimzi's CRDs as strict JSON schemas, for validating the manifests offline.

    python deploy/k8s/schemas/crd_to_jsonschema.py STRIMZI/packaging/install/cluster-operator

reads the CRD files of a Strimzi release (its source at the release tag, or the
strimzi-crds-<version>.yaml release asset split per file) and writes one schema per
kind and version that the manifests use into deploy/k8s/schemas/strimzi/. Kubernetes
drops unknown fields of a custom resource silently; these schemas refuse them
(``additionalProperties: false`` wherever the CRD lists the fields), so a misspelt
field fails validation instead of vanishing. CEL rules (x-kubernetes-validations)
are left out: only the API server evaluates them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

# The Strimzi release the schemas come from; the manifests' apiVersions follow it.
STRIMZI_VERSION = "1.2.0"
KINDS = ("Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser")
OUT = Path(__file__).resolve().parent / "strimzi"


def strict(node: Any) -> Any:
    """A CRD's OpenAPI v3 schema node as JSON schema that refuses unknown fields."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: strict(value)
        for key, value in node.items()
        if key not in ("description", "x-kubernetes-validations")
    }
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and not preserve:
        out.setdefault("additionalProperties", False)
    return out


def schemas(crds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """File name -> schema, for every served version of the kinds in KINDS."""
    found = {}
    for crd in crds:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        kind, group = crd["spec"]["names"]["kind"], crd["spec"]["group"]
        if kind not in KINDS:
            continue
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
                found[f"{group}_{kind.lower()}_{version['name']}.json"] = schema
    return found


def main(folder: Path) -> None:
    crds = [
        doc
        for path in sorted(folder.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]
    found = schemas(crds)
    missing = {kind for kind in KINDS if not any(f"_{kind.lower()}_" in name for name in found)}
    if missing:
        sys.exit(f"no CRD for {', '.join(sorted(missing))} in {folder}")
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    for name, schema in sorted(found.items()):
        (OUT / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
