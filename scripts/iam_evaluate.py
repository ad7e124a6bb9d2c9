"""Evaluates AWS calls against a role's IAM policies, with moto's policy evaluator.

The emulators enforce no IAM, so the tests hold every call a function makes to the role
the template grants it (tests/e2e/tests/iam.rs). This is the evaluation step: moto implements
IAM's statement logic (Allow/Deny, Action/NotAction, wildcards in actions and resources)
for its own access control, maintained with moto; it runs in the emulator's virtualenv.

Reads JSON on stdin: {"policies": [<policy document, or its text>, ...],
                      "accesses": [{"action": "sqs:SendMessage", "resource": "arn:..."}, ...]}
Writes JSON on stdout: one verdict per access, "allowed", "denied" (an explicit Deny) or
"implicitly denied" (no statement allows it).

usage: .venv/bin/python scripts/iam_evaluate.py < request.json
"""

import ast
import json
import sys

from moto.iam.access_control import IAMPolicy, PermissionResult


def verdict(policies, action, resource):
    allowed = False
    for policy in policies:
        result = policy.is_action_permitted(action, resource)
        if result == PermissionResult.DENIED:
            return "denied"
        if result == PermissionResult.PERMITTED:
            allowed = True
    return "allowed" if allowed else "implicitly denied"


def document(policy):
    """A policy document given as an object, or as text: JSON (AWS's GetRolePolicy), or a
    Python literal (what moto's CloudFormation stores for an inline policy)."""
    if isinstance(policy, str):
        try:
            policy = json.loads(policy)
        except ValueError:
            policy = ast.literal_eval(policy)
    # A statement under a false condition (`!If [c, {...}, !Ref AWS::NoValue]`) is no
    # statement; moto's CloudFormation leaves it as a null.
    if isinstance(policy.get("Statement"), list):
        policy["Statement"] = [s for s in policy["Statement"] if s is not None]
    return policy


def main() -> int:
    request = json.load(sys.stdin)
    policies = [IAMPolicy(json.dumps(document(p))) for p in request["policies"]]
    verdicts = [verdict(policies, a["action"], a["resource"]) for a in request["accesses"]]
    json.dump(verdicts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
