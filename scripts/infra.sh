#!/usr/bin/env bash
# Checks of the infrastructure templates, offline: the main stack (infra/template.yaml), the
# reusable store (infra/store.yaml), the orders example on it (infra/handler.yaml), the
# template `keeper new` writes for a team's crate (tests/harness/templates/handler), and the
# CDK construct's orders app (infra/cdk), synthesised with bundling skipped.
#
#   scripts/infra.sh install     create .venv-infra with pinned cfn-lint, checkov, aws-sam-translator,
#                                and infra/cdk/node_modules from its lockfile (no-op when done)
#   scripts/infra.sh translate   SAM -> CloudFormation JSON in target/infra/ (nested stores beside),
#                                and the CDK app synthesised into target/infra/cdk/
#   scripts/infra.sh lint        cfn-lint on the SAM templates and on the translated ones
#   scripts/infra.sh scan        checkov on every template (zero failed checks required)
#   scripts/infra.sh check       all of the above
#
# The tools live in their own virtualenv: checkov pins versions of boto3 that the
# emulator's environment must not get.
set -euo pipefail

CFN_LINT_VERSION="1.58.0"
CHECKOV_VERSION="3.3.30"
SAM_TRANSLATOR_VERSION="1.115.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-infra"
OUT="$ROOT/target/infra"
TEMPLATE="$ROOT/infra/template.yaml"
# A handler of one's own, deployed beside the main stack (docs/HANDLERS.md, "Write your own handler").
HANDLER_TEMPLATE="$ROOT/infra/handler.yaml"
STORE_TEMPLATE="$ROOT/infra/store.yaml"
# The template `keeper new` writes, rendered for a crate named my-handler beside the store.
SCAFFOLD="$OUT/scaffold"
# The checks a team's handler template is not held to here, since each is its own choice
# and the store is checked whole: a function concurrency limit (the event source's
# MaximumConcurrency bounds it), a function DLQ (failed records go back to the queue and
# its DLQ), a VPC, a KMS key for the environment (names and tuning numbers, no secrets),
# and a customer managed key for its own table.
TEAM_SKIPS="CKV_AWS_115,CKV_AWS_116,CKV_AWS_117,CKV_AWS_173,CKV_AWS_119"
CDK="$ROOT/infra/cdk"
CDK_OUT="$OUT/cdk"

# The CDK packages, exactly as the lockfile pins them; installed again when it changes.
install_cdk() {
  command -v npm >/dev/null 2>&1 || {
    echo "npm is needed to synthesise the CDK construct (infra/cdk); install Node.js" >&2
    return 1
  }
  local stamp="$CDK/node_modules/.lock-installed"
  if [ -f "$stamp" ] && cmp -s "$stamp" "$CDK/package-lock.json"; then return 0; fi
  echo "installing the CDK construct's packages (npm ci in infra/cdk)" >&2
  (cd "$CDK" && npm ci --silent --no-audit --no-fund >&2)
  cp "$CDK/package-lock.json" "$stamp"
}

# The orders app of the CDK construct, compiled and synthesised offline: bundling skipped
# (no cargo lambda build), the template in target/infra/cdk/Orders.template.json.
synth() {
  install_cdk
  (cd "$CDK" && npx --no-install tsc)
  rm -rf "$CDK_OUT"
  CDK_OUTDIR="$CDK_OUT" CDK_CONTEXT_JSON='{"aws:cdk:bundling-stacks":[]}' node "$CDK/dist/bin/orders.js"
  echo "synthesised infra/cdk -> $CDK_OUT/Orders.template.json"
}

installed() {
  [ -x "$VENV/bin/cfn-lint" ] && [ -x "$VENV/bin/checkov" ] &&
    [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("cfn-lint"), m.version("checkov"), m.version("aws-sam-translator"))' 2>/dev/null)" = "$CFN_LINT_VERSION $CHECKOV_VERSION $SAM_TRANSLATOR_VERSION" ]
}

install() {
  if installed; then return 0; fi
  echo "installing cfn-lint==$CFN_LINT_VERSION checkov==$CHECKOV_VERSION aws-sam-translator==$SAM_TRANSLATOR_VERSION into $VENV" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "cfn-lint==$CFN_LINT_VERSION" "checkov==$CHECKOV_VERSION" \
    "aws-sam-translator==$SAM_TRANSLATOR_VERSION"
}

translate() {
  install
  mkdir -p "$OUT"
  "$VENV/bin/python" "$ROOT/infra/translate.py" "$TEMPLATE" "$OUT/template.json" \
    DownstreamUrl=https://downstream.example.com/ingest
  "$VENV/bin/python" "$ROOT/infra/translate.py" "$HANDLER_TEMPLATE" "$OUT/handler.json" \
    AlarmTopicArn=arn:aws:sns:us-east-1:123456789012:alarms
  mkdir -p "$SCAFFOLD"
  sed 's/{{name}}/my-handler/g' "$ROOT/tests/harness/templates/handler/template.yaml" >"$SCAFFOLD/template.yaml"
  cp "$STORE_TEMPLATE" "$SCAFFOLD/store.yaml"
  "$VENV/bin/python" "$ROOT/infra/translate.py" "$SCAFFOLD/template.yaml" "$OUT/scaffold.json"
  synth
}

lint() {
  translate
  echo "cfn-lint: SAM template"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$TEMPLATE"
  echo "cfn-lint: translated template, and the store as it nests it"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$OUT/template.json" "$OUT/template.json.Store.json"
  echo "cfn-lint: handler template (SAM and translated)"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$HANDLER_TEMPLATE" "$OUT/handler.json"
  echo "cfn-lint: the store, and the template keeper new writes (SAM and translated)"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$STORE_TEMPLATE" "$SCAFFOLD/template.yaml" "$OUT/scaffold.json"
  # W3005: CDK makes a function depend on its role, which its GetAtt already implies.
  echo "cfn-lint: the CDK construct's synthesised template"
  "$VENV/bin/cfn-lint" --region us-east-1 --ignore-checks W3005 -- "$CDK_OUT/Orders.template.json"
  echo "cfn-lint: no findings"
}

scan() {
  install
  # checkov is given paths relative to the repository, never absolute ones. It scans the
  # path it records in each resource (`__file__`) as if it were an environment value, so a
  # clone whose absolute path reaches 40 letters and slashes fails CKV_AWS_45 on its own name.
  (
    cd "$ROOT"
    echo "checkov: SAM template"
    checkov_file "$TEMPLATE"
    echo "checkov: translated template"
    checkov_file "$OUT/template.json"
    echo "checkov: the store, and as the main template nests it"
    checkov_file "$STORE_TEMPLATE"
    checkov_file "$OUT/template.json.Store.json"
    echo "checkov: handler templates (SAM and translated), without the team's own choices ($TEAM_SKIPS)"
    for template in "$HANDLER_TEMPLATE" "$OUT/handler.json" "$SCAFFOLD/template.yaml" "$OUT/scaffold.json" \
      "$CDK_OUT/Orders.template.json"; do
      checkov_file "$template" --skip-check "$TEAM_SKIPS"
    done
  )
}

# checkov on one template, named by its path inside the repository; further flags follow it.
checkov_file() {
  local template="${1#"$ROOT"/}"
  shift
  "$VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation "$@" --file "$template"
}

case "${1:-}" in
  install) install && install_cdk ;;
  translate) translate ;;
  lint) lint ;;
  scan) translate >/dev/null && scan ;;
  # Not `lint && scan`: inside a function called as part of an && list, `set -e` is off,
  # and a cfn-lint finding would not fail the check.
  check) lint; scan ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
