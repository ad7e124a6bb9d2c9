#!/usr/bin/env bash
# Checks of the infrastructure template, offline.
#
#   scripts/infra.sh install     create .venv-infra with pinned cfn-lint, checkov, aws-sam-translator (no-op when done)
#   scripts/infra.sh translate   SAM -> CloudFormation JSON in target/infra/template.json
#   scripts/infra.sh lint        cfn-lint on the SAM template and on the translated template
#   scripts/infra.sh scan        checkov on the template (zero failed checks required)
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
}

lint() {
  translate
  echo "cfn-lint: SAM template"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$TEMPLATE"
  echo "cfn-lint: translated template"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$OUT/template.json"
  echo "cfn-lint: handler template (SAM and translated)"
  "$VENV/bin/cfn-lint" --region us-east-1 -- "$HANDLER_TEMPLATE" "$OUT/handler.json"
  echo "cfn-lint: no findings"
}

scan() {
  install
  echo "checkov: SAM template"
  "$VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation --file "$TEMPLATE"
  echo "checkov: translated template"
  "$VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation --file "$OUT/template.json"
  echo "checkov: handler template (SAM and translated)"
  "$VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation --file "$HANDLER_TEMPLATE"
  "$VENV/bin/checkov" --quiet --compact --skip-download --framework cloudformation --file "$OUT/handler.json"
}

case "${1:-}" in
  install) install ;;
  translate) translate ;;
  lint) lint ;;
  scan) translate >/dev/null && scan ;;
  # Not `lint && scan`: inside a function called as part of an && list, `set -e` is off,
  # and a cfn-lint finding would not fail the check.
  check) lint; scan ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
