"""Translates the SAM template into plain CloudFormation, offline.

Used by scripts/infra.sh (lint of the translated template, and the deploy test against
the emulator). The SAM translator needs a region and a managed-policy loader; the
template uses no managed policies, so the loader returns none. Local CodeUri paths are
replaced by an S3 location, as `sam package` would do.

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
    translated = transform(template, parameters, NoManagedPolicies())
    # Written beside the target, then renamed over it.
    # A reader running at the same time then sees the old file or the new one, never half.
    partial = f"{target}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(translated, f, indent=2, sort_keys=True)
    os.replace(partial, target)
    print(f"translated {source} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
