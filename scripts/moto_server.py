"""Starts moto's server with what CloudFormation does and moto 5.2.5 does not.

scripts/emulator.sh runs this in place of `moto_server`, with the same arguments. Two
additions, both needed by a template nesting the reusable store (infra/store.yaml):

- `Fn::GetAtt` of a nested stack's output (`Store.Outputs.Name`). moto creates the nested
  stack, but its stack resource has no attributes, so the parent's creation fails.
- A list element that is `AWS::NoValue` (an `Fn::If` branch) is removed, as CloudFormation
  removes it. moto keeps it as `null`, and IAM then refuses a managed policy whose
  statements hold one.
- A role's `ManagedPolicyArns` are attached to it, as CloudFormation attaches them: moto
  creates the role with its inline policies only. A policy moto does not hold (the AWS
  managed policies, which it does not load) is left out.
"""

import sys

import moto.cloudformation.parsing as parsing
from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
from moto.cloudformation.models import Stack
from moto.iam.exceptions import NotFoundException
from moto.iam.models import Role, iam_backends
from moto.utilities.utils import get_partition


def nested_stack_output(self, attribute_name):
    """The value of the output `attribute_name` names (`Outputs.Name`), as CloudFormation gives it."""
    prefix = "Outputs."
    if attribute_name.startswith(prefix):
        name = attribute_name[len(prefix):]
        for output in self.output_map.values():
            if output and output.key == name:
                return output.value
    raise UnformattedGetAttTemplateException()


Stack.get_cfn_attribute = nested_stack_output

moto_clean_json = parsing.clean_json


def clean_json(resource_json, resources_map):
    """moto's `clean_json`, with the elements of a list that resolve to no value removed.

    moto's own recursion calls this module-level name, so nested lists are cleaned too."""
    if isinstance(resource_json, list):
        cleaned = [(item, moto_clean_json(item, resources_map)) for item in resource_json]
        return [value for item, value in cleaned if not (isinstance(item, dict) and value is None)]
    return moto_clean_json(resource_json, resources_map)


parsing.clean_json = clean_json

moto_create_role = Role.create_from_cloudformation_json.__func__


def create_role(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    """moto's role from a template, with its managed policies attached."""
    role = moto_create_role(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
    backend = iam_backends[account_id][get_partition(region_name)]
    for arn in cloudformation_json["Properties"].get("ManagedPolicyArns", []):
        try:
            backend.attach_role_policy(arn, role.name)
        except NotFoundException:
            pass
    return role


Role.create_from_cloudformation_json = classmethod(create_role)

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main())
