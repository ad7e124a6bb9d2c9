"""Translates the SAM template into plain CloudFormation, offline.

Used by scripts/infra.sh (lint of the translated template, and the deploy test against
the emulator). The SAM translator needs a region and a managed-policy loader; the
template uses no managed policies, so the loader returns none. Local CodeUri paths are
replaced by an S3 location, as `sam package` would do. So is a nested application's local
`Location` (the reusable store, infra/store.yaml): the nested template is written beside
the output as `<output>.<LogicalId>.json`, and the deploy test uploads it there.

usage: python infra/translate.py infra/template.yaml out.json [Key=Value ...]
"""

import json
import os
import sys

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from samtranslator.translator.transform import transform  # noqa: E402
from samtranslator.yaml_helper import yaml_parse  # noqa: E402


class NoManagedPolicies:
    """The template attaches no AWS managed policies."""

    def load(self):
        return {}


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, target = sys.argv[1], sys.argv[2]
    parameters = dict(arg.split("=", 1) for arg in sys.argv[3:])
    with open(source, encoding="utf-8") as f:
        template = yaml_parse(f.read())
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = f"s3://sam-artifacts-placeholder/{name}.zip"
        if resource.get("Type") == "AWS::Serverless::Application":
            nest(source, target, name, resource["Properties"])
    write(target, transform(template, parameters, NoManagedPolicies()))
    print(f"translated {source} -> {target}")
    return 0


def nest(source, target, name, properties):
    """Writes the nested template a local `Location` names beside `target`, and points the
    application at the S3 URL `sam package` would give it."""
    location = properties["Location"]
    if not isinstance(location, str) or location.startswith(("https://", "s3://")):
        return
    with open(os.path.join(os.path.dirname(source), location), encoding="utf-8") as f:
        nested = yaml_parse(f.read())
    write(f"{target}.{name}.json", nested)
    key = f"{os.path.basename(target)}.{name}.json"
    properties["Location"] = f"https://s3.amazonaws.com/sam-artifacts-placeholder/{key}"


def write(target, template):
    """Writes `template` as JSON beside `target`, then renames it over `target`: a reader
    running at the same time sees the old file or the new one, never half."""
    partial = f"{target}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(template, f, indent=2, sort_keys=True)
    os.replace(partial, target)


if __name__ == "__main__":
    sys.exit(main())
