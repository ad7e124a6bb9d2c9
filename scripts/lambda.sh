#!/usr/bin/env bash
# Builds the function binaries the way they ship: cargo-lambda (pinned, installed into
# .venv-lambda from PyPI, with Zig for the linker), the release profile of Cargo.toml (the one
# `sam build` uses too), the provided.al2023 layout (one `bootstrap` per function).
#
#   scripts/lambda.sh install               install cargo-lambda (no-op when done)
#   scripts/lambda.sh package [ARCH]        the worker and redrive functions as deployable zips,
#                                           $TARGET/lambda/{worker,redrive}/bootstrap.zip, and
#                                           their sizes; ARCH is arm64 (the template's default)
#                                           or x86_64
#   scripts/lambda.sh bench                 the worker, the hello-world peer and the bare
#                                           function (the cost benchmark's floor) for this machine,
#                                           $TARGET/lambda/{worker,hello_lambda,bare_function}/bootstrap,
#                                           built exactly as `package` builds (what `make bench`
#                                           measures), and the worker's bootstrap.zip
#   scripts/lambda.sh shipped               the binaries `make test` runs its compiled-binary
#                                           suites on, for this machine, built exactly as
#                                           `package` builds: $TARGET/lambda/{worker,redrive,
#                                           orders-worker,fixture-handler}/bootstrap
#
# TARGET is $CARGO_TARGET_DIR, else target/. Each binary is built as SAM builds it (see
# build() below).
set -euo pipefail

CARGO_LAMBDA_VERSION="1.9.2"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-lambda"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"

installed() {
  [ -x "$VENV/bin/cargo-lambda" ] &&
    [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("cargo-lambda"))' 2>/dev/null)" = "$CARGO_LAMBDA_VERSION" ]
}

install() {
  if installed; then return 0; fi
  echo "installing cargo-lambda==$CARGO_LAMBDA_VERSION into $VENV" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "cargo-lambda==$CARGO_LAMBDA_VERSION"
}

# The Rust target of a Lambda architecture, refused with advice when it is not installed.
triple_of() {
  local triple
  case "$1" in
    arm64) triple=aarch64-unknown-linux-gnu ;;
    x86_64) triple=x86_64-unknown-linux-gnu ;;
    *) echo "unknown architecture $1: arm64 or x86_64" >&2; return 2 ;;
  esac
  if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$triple"; then
    echo "the Rust target $triple is not installed: rustup target add $triple" >&2
    echo "(or build for the other architecture and deploy with Architecture set to it)" >&2
    return 2
  fi
  echo "$triple"
}

# cargo lambda build --release for one binary, at the workspace root without `-p`, as
# `sam build` runs it (aws-lambda-builders' rust-cargolambda: `--bin <Binary>` only): Cargo
# selects the workspace's default members (the deployable functions, Cargo.toml) and unifies
# their features, so what is built here is byte for byte the build SAM deploys. A package
# outside the default members is selected by a fourth argument, Cargo's `-p` flags: the test
# fixture with the default members beside it (default_members_and), so that Cargo resolves
# the same features for the dependencies they share and reuses their compiled code (built
# alone, its smaller feature set compiled the AWS SDK a second time in release); the
# benchmark's hello-world peer alone, so that it carries none of the functions' features.
default_members_and() {
  local member
  for member in $(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
metadata = json.load(sys.stdin)
default = set(metadata["workspace_default_members"])
print(" ".join(p["name"] for p in metadata["packages"] if p["id"] in default))') "$1"; do
    printf -- '-p %s ' "$member"
  done
}

# BINARIES is one binary or several, space-separated: one invocation builds them all, and
# Cargo runs their (whole-program LTO) links in parallel.
build() {
  local triple="$1" binaries="$2" format="$3" packages="${4:-}" binary
  local selected=()
  for binary in $binaries; do
    selected+=(--bin "$binary")
  done
  PATH="$VENV/bin:$PATH" cargo lambda build --release --target "$triple" \
    $packages "${selected[@]}" --output-format "$format" --lambda-dir "$TARGET/lambda"
}

size_of() {
  stat -c %s "$1"
}

package() {
  local arch="${1:-arm64}" triple
  triple="$(triple_of "$arch")"
  install
  build "$triple" "worker redrive" zip
  echo "deployable zips ($arch):"
  for function in worker redrive; do
    local zip="$TARGET/lambda/$function/bootstrap.zip"
    local binary="$TARGET/$triple/release/$function"
    printf '  %-8s %s  %9d bytes zipped, %9d bytes unzipped\n' \
      "$function" "$zip" "$(size_of "$zip")" "$(size_of "$binary")"
  done
}

# The Lambda architecture of this machine (what can run here).
native_arch() {
  case "$(uname -m)" in
    aarch64 | arm64) echo arm64 ;;
    *) echo x86_64 ;;
  esac
}

shipped() {
  local triple
  triple="$(triple_of "$(native_arch)")"
  install
  # The two functions, the handler infra/handler.yaml deploys and a handler that panics on
  # request (a test fixture, outside the default members), in one invocation, so that the
  # four whole-program links run side by side. The fixture asks nothing of the dependencies
  # the default members do not, so Cargo resolves the functions' build exactly as SAM's
  # (`default_members_and`).
  build "$triple" "worker redrive orders-worker fixture-handler" binary \
    "$(default_members_and fixture-handler)"
}

bench() {
  local triple
  triple="$(triple_of "$(native_arch)")"
  install
  # The zip first (its size is reported), then the binary beside it; one compilation.
  build "$triple" worker zip
  build "$triple" worker binary
  build "$triple" hello_lambda binary "-p sqs-keeper-local"
  build "$triple" bare_function binary "-p sqs-keeper-local"
}

case "${1:-}" in
  install) install ;;
  package) package "${2:-arm64}" ;;
  bench) bench ;;
  shipped) shipped ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
