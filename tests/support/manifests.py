"""The Kubernetes manifests in deploy/kubernetes/, validated offline: built-in kinds against
kubernetes-validate's schemas, custom resources (KEDA, KServe) against their CRDs' own schemas,
vendored in tests/data/crds/ (its README.md says from where)."""

from __future__ import annotations

import argparse
import json
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from support.paths import ROOT, TESTS
from workerpool.cli.main import build_parser
from workerpool.config.models import split_per_model

KUBERNETES = "1.33.0"  # the schema version the manifests are checked against
MANIFESTS = ROOT / "deploy" / "kubernetes"
CRDS = TESTS / "data" / "crds"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "serving.kserve.io_inferenceservices.v1beta1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "serving.kserve.io_servingruntimes.v1alpha1.json",
}
"""The custom resources the manifests use, and the file holding each one's openAPIV3Schema."""


def documents(name: str) -> list[dict[str, Any]]:
    """The documents of one manifest file in deploy/kubernetes/."""
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def every_document() -> dict[str, list[dict[str, Any]]]:
    return {path.name: documents(path.name) for path in sorted(MANIFESTS.glob("*.yaml"))}


def the(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one document of a kind."""
    [document] = [d for d in found if d["kind"] == kind]
    return document


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    return json.loads((CRDS / CRD_SCHEMAS[api_version, kind]).read_text())


def unknown_fields(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Where ``instance`` has a key its structural schema does not declare. The API server prunes
    such keys silently (a typo is dropped, not refused); jsonschema allows them. A key is declared
    by ``properties``, by an ``additionalProperties`` schema (a map) or under
    ``x-kubernetes-preserve-unknown-fields``."""
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [found for index, item in enumerate(instance)
                for found in unknown_fields(item, schema["items"], f"{path}[{index}]")]
    if not isinstance(instance, dict):
        return []
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    found = []
    for key, value in instance.items():
        where = f"{path}.{key}"
        if key in properties:
            found += unknown_fields(value, properties[key], where)
        elif isinstance(extra, dict):
            found += unknown_fields(value, extra, where)
        elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
            found.append(where)
    return found


def validated(document: dict[str, Any]) -> None:
    """Raises unless ``document`` is valid: a built-in kind as kubernetes-validate's strict
    schemas say; a custom resource as its CRD's schema says, with no key the schema lacks, its
    metadata as any object's and its containers (a ServingRuntime's) as a Pod's."""
    key = document["apiVersion"], document["kind"]
    if key not in CRD_SCHEMAS:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
        return
    schema = crd_schema(*key)
    jsonschema.Draft202012Validator(schema).validate(document)
    body = {name: value for name, value in document.items() if name != "metadata"}
    unknown = unknown_fields(body, schema)
    if unknown:
        raise jsonschema.ValidationError(f"{'/'.join(key)} has fields its CRD lacks: {unknown}")
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
                                 KUBERNETES, strict=True)
    containers = document["spec"].get("containers") or []
    if containers:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
                                      "spec": {"containers": containers}}, KUBERNETES, strict=True)


def serve_accepts(args: list[str]) -> argparse.Namespace:
    """``serve`` parses the container's arguments (a KServe placeholder stands for a name)."""
    parsed = build_parser().parse_args(["serve", *[a.replace("{{.Name}}", "model") for a in args]])
    assert all(model.endswith(".bpk") for model in parsed.models) and parsed.models
    parsed.workers = split_per_model(parsed.workers, None)[0]  # the worker count, as serve reads it
    return parsed
