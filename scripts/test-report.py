#!/usr/bin/env python3
"""Print the test run's wall time per tier and its ten slowest tests, as a Markdown table.

Reads what scripts/run-tests.sh leaves in the report directory (tiers.tsv, junit-<tier>.xml)
and, when given, the set-up time. `.ci/run` calls it at the end, on failure too.

    scripts/test-report.py [REPORT_DIR] [--setup-seconds N] [--total-seconds N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Tuple

from xml.etree import ElementTree  # reading pytest's own junit output, nothing untrusted


def minutes(seconds: float) -> str:
    return "%d min %02d s" % divmod(int(round(seconds)), 60)


def read_tiers(report: Path) -> List[Tuple[str, float, int, str]]:
    """(tier, seconds, exit status, machine CPU busy % meanwhile or '') per line of tiers.tsv."""
    rows = []
    tsv = report / "tiers.tsv"
    if tsv.is_file():
        for line in tsv.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) in (3, 4):
                busy = parts[3] if len(parts) == 4 and parts[3] else ""
                rows.append((parts[0], float(parts[1]), int(parts[2]), busy))
    return rows


def read_tests(report: Path) -> List[Tuple[float, str, str, str]]:
    tests = []
    for junit in sorted(report.glob("junit-*.xml")):
        tier = junit.stem[len("junit-"):]
        try:
            root = ElementTree.parse(str(junit)).getroot()
        except ElementTree.ParseError as err:
            print("test-report: %s is not readable (%s); its tier was probably cut short" % (junit, err),
                  file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            outcome = "passed"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "FAILED"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            name = "%s::%s" % (case.get("classname", ""), case.get("name", ""))
            tests.append((float(case.get("time") or 0), tier, name, outcome))
    return sorted(tests, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default=".cache/test-report")
    parser.add_argument("--setup-seconds", type=float)
    parser.add_argument("--total-seconds", type=float)
    args = parser.parse_args()
    report = Path(args.report)

    print("\n## Test run: wall time per tier\n")
    # CPU busy: the whole machine's, all cores, while the tier ran (tiers side by side share it).
    print("| tier | wall time | result | machine CPU busy |")
    print("| --- | --- | --- | --- |")
    if args.setup_seconds is not None:
        print("| set-up (apt, venv, libvirtd) | %s | | |" % minutes(args.setup_seconds))
    for tier, seconds, rc, busy in read_tiers(report):
        print("| %s | %s | %s | %s |" % (tier, minutes(seconds), "passed" if rc == 0 else "FAILED (rc %d)" % rc,
                                         busy + " %" if busy else ""))
    if args.total_seconds is not None:
        print("| **total** | **%s** | | |" % minutes(args.total_seconds))

    print("\n## Ten slowest tests (set-up and teardown included)\n")
    print("| time | tier | test | result |")
    print("| --- | --- | --- | --- |")
    for seconds, tier, name, outcome in read_tests(report)[:10]:
        print("| %s | %s | `%s` | %s |" % (minutes(seconds), tier, name, outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
