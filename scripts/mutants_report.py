#!/usr/bin/env python3
"""The score of `make mutants` (scripts/mutants.sh): reads every shard's
mutants.out/outcomes.json and prints, as Markdown for docs/SIMULATION.md, the caught,
missed, unviable and timed-out mutants per module, the share of viable mutants caught,
the shards finished and the time they took, and the list of missed mutants.

Usage: mutants_report.py OUT_DIR SHARDS
"""
import collections
import json
import pathlib
import sys

SUMMARIES = {
    "CaughtMutant": "caught",
    "MissedMutant": "missed",
    "Unviable": "unviable",
    "Timeout": "timeout",
}


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    shards = int(sys.argv[2])
    counts = collections.defaultdict(collections.Counter)
    missed = []
    finished, seconds = 0, 0
    for k in range(shards):
        shard = out / f"shard-{k}-of-{shards}"
        done = shard / "seconds"
        if done.exists():
            finished += 1
            seconds += int(done.read_text().strip() or 0)
        outcomes = shard / "mutants.out" / "outcomes.json"
        if not outcomes.exists():
            continue
        for outcome in json.loads(outcomes.read_text())["outcomes"]:
            scenario = outcome["scenario"]
            if not isinstance(scenario, dict) or "Mutant" not in scenario:
                continue
            mutant = scenario["Mutant"]
            kind = SUMMARIES.get(outcome["summary"])
            if kind is None:
                continue
            counts[mutant["file"]][kind] += 1
            if kind == "missed":
                missed.append(mutant["name"])
    total = collections.Counter()
    print("| module | caught | missed | timeout | unviable | caught of viable |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        print(row(module.removeprefix("shared/core/src/"), c))
    print(row("**all**", total))
    print()
    print(
        f"{finished} of {shards} shards finished in {seconds // 3600} h {seconds % 3600 // 60} min"
        " (a shard's time includes its unmutated baseline build)."
    )
    if missed:
        print()
        print("Missed:")
        print()
        for name in sorted(missed):
            print(f"- `{name}`")
    return 0


def row(name: str, c: collections.Counter) -> str:
    viable = c["caught"] + c["missed"] + c["timeout"]
    share = f"{100 * (c['caught'] + c['timeout']) / viable:.0f} %" if viable else "-"
    return f"| {name} | {c['caught']} | {c['missed']} | {c['timeout']} | {c['unviable']} | {share} |"


if __name__ == "__main__":
    sys.exit(main())
