#!/usr/bin/env python3
"""Counts the public API of library crates from rustdoc's JSON output (nightly rustdoc).

    scripts/public_items.py sqs-keeper [more packages...]

For each package: the items a user can name (rustdoc's `paths` of the crate itself: modules,
types, traits, functions, constants, macros) by kind, and every public item rustdoc documents
(`index`: also methods, fields and variants). Builds with `cargo +nightly rustdoc` into
target/public-items, apart from the stable build.
"""
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "public-items")


def count(package):
    subprocess.run(
        ["cargo", "+nightly", "rustdoc", "--quiet", "-p", package, "--lib", "--all-features",
         "--target-dir", TARGET, "--", "-Z", "unstable-options", "--output-format", "json"],
        cwd=ROOT, check=True)
    crate = package.replace("-", "_")
    with open(os.path.join(TARGET, "doc", crate + ".json")) as f:
        doc = json.load(f)
    named = collections.Counter(
        p["kind"] for p in doc["paths"].values() if p["crate_id"] == 0)
    documented = sum(1 for i in doc["index"].values()
                     if i["crate_id"] == 0 and i["visibility"] == "public")
    return named, documented


def main():
    packages = sys.argv[1:] or ["sqs-keeper"]
    for package in packages:
        named, documented = count(package)
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(named.items()))
        print(f"{package}: {sum(named.values())} nameable ({kinds}); {documented} public items in all")


if __name__ == "__main__":
    main()
