#!/usr/bin/env python3
"""Prints the test-case totals of the last `bazel test` run.

Reads the JUnit XML that Bazel leaves in bazel-testlogs/ for every test
target of the workspace (`bazel query 'tests(//...)'`: logs of targets that
no longer exist are not counted) and prints one line:
'N passed, N failed, N skipped'.
"""
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def logs():
    try:
        labels = subprocess.run(["bazel", "query", "tests(//...)", "--output=label"], check=True,
                                capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return glob.glob("bazel-testlogs/**/test.xml", recursive=True)
    paths = []
    for label in labels:
        package, _, name = label.lstrip("/").partition(":")
        path = os.path.join("bazel-testlogs", package, name, "test.xml")
        if os.path.exists(path):
            paths.append(path)
    return paths


passed = failed = skipped = 0
for path in logs():
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        failed += 1
        continue
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("status") == "notrun" \
                or case.get("result") == "skipped":
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(0)
