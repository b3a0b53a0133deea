#!/usr/bin/env python3
"""Condensed progress for scripts/test.sh, and the count of individual tests.

    <build command> 2>&1 | test_progress.py build LOG
    ctest -V ...     2>&1 | test_progress.py ctest LOG COUNTS
    <unittest run>   2>&1 | test_progress.py unittest LOG COUNTS

Reads a command's output on stdin, keeps all of it in LOG, and prints a short
line per step (a target built, a test finished) with the elapsed time, plus
a heartbeat naming what still runs when nothing finished for a while, so a
long stage is never silent.  Warnings and errors are printed in full.

ctest / unittest modes also count individual tests and write "PASSED FAILED"
to COUNTS.  For each ctest test, from its output (ctest -V prefixes every
line with "<test number>: "):
  - Python unittest: "Ran N tests" and the closing "OK"/"FAILED (...)" line;
  - C programs using tests/unit/check.h: "checks: N passed, M failed";
  - anything else (fuzz targets, other programs): one test, as ctest judged it.
A test that ctest failed counts at least one failure whatever it printed.
The output of every failed test is printed in full at the end.
"""
import os
import re
import sys
import threading
import time

HEARTBEAT_S = 20

# Times are since PARLEY_TEST_T0 (epoch seconds: when test.sh started), so
# every stage's lines share one clock; else since this script started.
START = float(os.environ.get("PARLEY_TEST_T0") or time.time())
lock = threading.Lock()
last_print = [time.monotonic()]


def say(line):
    with lock:
        elapsed = int(time.time() - START)
        print("  [%d:%02d] %s" % (elapsed // 60, elapsed % 60, line), flush=True)
        last_print[0] = time.monotonic()


def heartbeat(running, stop):
    while not stop.wait(5):
        if time.monotonic() - last_print[0] >= HEARTBEAT_S:
            with lock:
                names = sorted(running.values()) if running else []
            say("... still running: %s" % (", ".join(names[:6]) + (" ..." if len(names) > 6 else ""))
                if names else "... still working")


BUILD_STEP = re.compile(r"^\[\s*(\d+)%\] (Built target \S+|Linking .*)$")
PROBLEM = re.compile(r"(error|warning):|^CMake Error|^make.*\*\*\*|^ninja: build stopped", re.I)


def run_build(log):
    running, stop = {}, threading.Event()
    threading.Thread(target=heartbeat, args=(running, stop), daemon=True).start()
    for line in sys.stdin:
        log.write(line)
        line = line.rstrip("\n")
        m = BUILD_STEP.match(line)
        if m and m.group(2).startswith("Built target"):
            say("%3s%% %s" % (m.group(1), m.group(2)))
        elif PROBLEM.search(line):
            say(line)
    stop.set()


STARTED = re.compile(r"^\s*Start\s+(\d+): (\S+)")
FINISHED = re.compile(r"^\s*\d+/\d+ Test\s+#(\d+): (\S+) \.*\s*(\**)([A-Za-z]+)(.*)$")
PREFIXED = re.compile(r"^(\d+): (.*)$")
RAN = re.compile(r"^Ran (\d+) tests? in ")
UNITTEST_END = re.compile(r"^(OK|FAILED)\b(?: \((.*)\))?$")
CHECKS = re.compile(r"^checks: (\d+) passed, (\d+) failed$")


class Counter:
    """Counts of one test's output lines."""

    def __init__(self):
        self.ran = 0          # unittest "Ran N tests"
        self.unit_failed = 0  # failures + errors from "FAILED (...)"
        self.unit_skipped = 0
        self.checks = None    # (passed, failed) from check.h
        self.lines = []

    def feed(self, text):
        self.lines.append(text)
        m = RAN.match(text)
        if m:
            self.ran += int(m.group(1))
            return
        m = UNITTEST_END.match(text)
        if m and m.group(2):
            for part in m.group(2).split(","):
                k, _, v = part.strip().partition("=")
                if k in ("failures", "errors", "unexpected successes") and v.isdigit():
                    self.unit_failed += int(v)
                elif k == "skipped" and v.isdigit():
                    self.unit_skipped += int(v)
            return
        m = CHECKS.match(text)
        if m:
            p, f = self.checks or (0, 0)
            self.checks = (p + int(m.group(1)), f + int(m.group(2)))

    def result(self, ctest_passed):
        """(passed, failed) individual tests."""
        if self.ran:
            failed = self.unit_failed
            passed = self.ran - failed - self.unit_skipped
        elif self.checks:
            passed, failed = self.checks
        else:
            passed, failed = (1, 0) if ctest_passed else (0, 1)
        if not ctest_passed and failed == 0:
            failed = 1  # e.g. a leak report or a crash after the last check
        return max(passed, 0), failed


def run_ctest(log, counts_path, unittest_mode):
    running, stop = {}, threading.Event()
    threading.Thread(target=heartbeat, args=(running, stop), daemon=True).start()
    counters, failed_tests = {}, []
    passed = failed = 0
    single = Counter()  # unittest mode: the whole output is one module's
    for raw in sys.stdin:
        log.write(raw)
        line = raw.rstrip("\n")
        if unittest_mode:
            single.feed(line)
            if line.endswith(" ... ok") or " ... FAIL" in line or " ... ERROR" in line:
                say(line)
            continue
        m = STARTED.match(line)
        if m:
            with lock:
                running[m.group(1)] = m.group(2)
            continue
        m = FINISHED.match(line)
        if m:
            num, name, status = m.group(1), m.group(2), m.group(4)
            with lock:
                running.pop(num, None)
            ok = status == "Passed"
            c = counters.pop(num, Counter())
            p, f = c.result(ok)
            passed += p
            failed += f
            say("%-40s %s: %d passed, %d failed%s" % (name, status, p, f, m.group(5).rstrip()
                                                      and "  (" + m.group(5).strip() + ")"))
            if not ok:
                failed_tests.append((name, c.lines))
            continue
        m = PREFIXED.match(line)
        if m:
            counters.setdefault(m.group(1), Counter()).feed(m.group(2))
    stop.set()
    if unittest_mode:
        # the caller's exit status decides a failure without unittest's own line
        passed, failed = single.result(True)
    for name, lines in failed_tests:
        print("\n---- output of failed test %s ----" % name)
        print("\n".join(lines[-400:]))
    with open(counts_path, "w") as f:
        f.write("%d %d\n" % (passed, failed))


def main():
    mode = sys.argv[1]
    with open(sys.argv[2], "a") as log:
        if mode == "build":
            run_build(log)
        elif mode in ("ctest", "unittest"):
            run_ctest(log, sys.argv[3], mode == "unittest")
        else:
            sys.exit("test_progress.py: unknown mode %s" % mode)


if __name__ == "__main__":
    main()
