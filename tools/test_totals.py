#!/usr/bin/env python3
"""Prints the test-case totals of the last `bazel test` run.

Reads the JUnit XML that Bazel leaves in bazel-testlogs/ for every test
target and prints one line: 'N passed, N failed, N skipped'.
"""
import glob
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for path in glob.glob("bazel-testlogs/**/test.xml", recursive=True):
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
