"""Starts moto's server with what CloudFormation does and moto 5.2.5 does not.

scripts/emulator.sh runs this in place of `moto_server`, with the same arguments. Two
additions, both needed by a template nesting the reusable store (infra/store.yaml):

- `Fn::GetAtt` of a nested stack's output (`Store.Outputs.Name`). moto creates the nested
  stack, but its stack resource has no attributes, so the parent's creation fails.
- A list element that is `AWS::NoValue` (an `Fn::If` branch) is removed, as CloudFormation
  removes it. moto keeps it as `null`, and IAM then refuses a managed policy whose
  statements hold one.
- A role's `ManagedPolicyArns` are attached to it, as CloudFormation attaches them: moto
  creates the role with its inline policies only. An AWS managed policy is left out, since
  moto does not load them; a missing policy of the account fails the role, as it would.
- A function's `Timeout` and `MemorySize` given as strings (a nested stack's output, as a
  handler template reads the store's `TimeoutSeconds`) are numbers, as CloudFormation
  converts them. moto keeps the string, and Lambda's API then answers with it.
"""

import sys

import moto.cloudformation.parsing as parsing
from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
from moto.cloudformation.models import Stack
from moto.iam.exceptions import NotFoundException
from moto.awslambda.models import LambdaFunction
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


def is_no_value(item, resources_map):
    """Whether `item` resolves to `AWS::NoValue`: the reference itself, or an `Fn::If`
    whose chosen branch is one. A reference to a resource whose condition is false is not:
    CloudFormation refuses it, and so must this."""
    if item == {"Ref": "AWS::NoValue"}:
        return True
    if isinstance(item, dict) and "Fn::If" in item:
        condition, when_true, when_false = item["Fn::If"]
        chosen = when_true if resources_map.lazy_condition_map[condition] else when_false
        return is_no_value(chosen, resources_map)
    return False


def clean_json(resource_json, resources_map):
    """moto's `clean_json`, with the elements of a list that resolve to `AWS::NoValue`
    removed.

    moto's own recursion calls this module-level name, so nested lists are cleaned too."""
    if isinstance(resource_json, list):
        return [
            moto_clean_json(item, resources_map)
            for item in resource_json
            if not is_no_value(item, resources_map)
        ]
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
            if ":aws:policy/" not in arn:
                raise
    return role


Role.create_from_cloudformation_json = classmethod(create_role)

moto_create_function = LambdaFunction.create_from_cloudformation_json.__func__


def create_function(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    """moto's function from a template, its numeric properties given as strings converted."""
    properties = cloudformation_json["Properties"]
    for name in ("Timeout", "MemorySize"):
        if isinstance(properties.get(name), str):
            properties[name] = int(properties[name])
    return moto_create_function(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)


LambdaFunction.create_from_cloudformation_json = classmethod(create_function)

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main())
