"""pytest plugin: every check made through sharpcheck's asserts in a run lands in one report, the
gate's JSON (--sharpcheck-report FILE) and JUnit XML (--sharpcheck-junit FILE), written atomically
by the same code as `sharpcheck gate`; the terminal summary lists the worst checks.

Enable with `pytest -p sharpcheck.pytest_plugin` (or `pytest_plugins = ["sharpcheck.pytest_plugin"]`
in a conftest.py)."""

from __future__ import annotations

import json
from typing import Any, List

import pytest

from . import _asserts, _sharpcheck


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("sharpcheck")
    group.addoption("--sharpcheck-report", metavar="FILE", default=None,
                    help="write every sharpcheck check of the run as the gate's JSON report")
    group.addoption("--sharpcheck-junit", metavar="FILE", default=None,
                    help="write every sharpcheck check of the run as JUnit XML")
    group.addoption("--sharpcheck-worst", metavar="N", type=int, default=5,
                    help="how many of the worst checks the terminal summary lists (default 5)")


def pytest_configure(config: Any) -> None:
    _asserts.recording = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any):  # type: ignore[no-untyped-def]
    _asserts.current_test = item.nodeid
    try:
        yield
    finally:
        _asserts.current_test = None


def _records() -> List[dict]:
    records = []
    for position, entry in enumerate(_asserts.RECORDED):
        record = dict(entry["record"])
        record["index"] = position  # the report's order: the order the checks ran
        records.append(record)
    return records


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    config = session.config
    cases = json.dumps(_records())
    report_path = config.getoption("--sharpcheck-report")
    junit_path = config.getoption("--sharpcheck-junit")
    if report_path:
        _sharpcheck.write_report(report_path, _sharpcheck.report_json(cases))
    if junit_path:
        _sharpcheck.write_report(junit_path, _sharpcheck.junit_xml(cases))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    records = _records()
    if not records:
        return
    worst = sorted(records, key=lambda r: float(r["max_bound_ratio"]), reverse=True)
    failed = sum(1 for r in records if r["status"] == "fail")
    inconclusive = sum(1 for r in records if r["status"] == "inconclusive")
    terminalreporter.section("sharpcheck")
    terminalreporter.write_line(f"{len(records)} checks against the correctly rounded reference: {failed} failed, "
                                f"{inconclusive} inconclusive")
    for record in worst[: config.getoption("--sharpcheck-worst")]:
        tiers = record["tiers"]
        terminalreporter.write_line(
            f"  {record['status']:<12} {record['kernel']}  {record['format']}  {record['elements']} elements  "
            f"max {record['max_ulps']} ulp  bound ratio {float(tiers['proven']['max_bound_ratio']):.3g} "
            f"(statistical {float(tiers['statistical']['max_bound_ratio']):.3g})")
