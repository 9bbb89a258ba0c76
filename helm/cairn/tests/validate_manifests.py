#!/usr/bin/env python3
"""Validate rendered chart manifests against the Kubernetes OpenAPI schemas.

Usage: validate_manifests.py KUBE_VERSION FILE...

Each FILE is the output of `helm template`. Every resource is checked with
kubernetes-validate in strict mode (unknown fields are errors). Custom resources have
no schema in kubernetes-validate; the expected ones are skipped and named in the
output, any other kind without a schema is an error.
"""

import sys

import kubernetes_validate
import yaml

# Custom resources the chart may render; kubernetes-validate ships no schema for them.
KNOWN_CUSTOM_RESOURCES = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


def validate_file(path, kube_version):
    """Return (number of valid resources, skipped kinds, error messages)."""
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    valid, skipped, errors = 0, set(), []
    if not docs:
        errors.append("no resources rendered")
    for doc in docs:
        api, kind = doc.get("apiVersion"), doc.get("kind")
        name = (doc.get("metadata") or {}).get("name", "?")
        if not api or not kind:
            errors.append(f"{name}: missing apiVersion or kind")
            continue
        if (api, kind) in KNOWN_CUSTOM_RESOURCES:
            skipped.add(kind)
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
            valid += 1
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{kind}/{name}: {e.message}")
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            errors.append(f"{kind}/{name}: {where}: {e.message}")
    return valid, skipped, errors


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    kube_version, paths = argv[1], argv[2:]
    failed = False
    for path in paths:
        valid, skipped, errors = validate_file(path, kube_version)
        note = ""
        if skipped:
            note = f"; skipped (custom resources, no schema): {', '.join(sorted(skipped))}"
        if errors:
            failed = True
            print(f"  invalid {path} for Kubernetes {kube_version}:")
            for err in errors:
                print(f"    {err}")
        else:
            print(f"  {valid} resources valid for Kubernetes {kube_version}{note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
