"""pytest plugin: every check made through sharpcheck's asserts in a run lands in one report, the
gate's JSON (--sharpcheck-report FILE) and JUnit XML (--sharpcheck-junit FILE), written atomically
by the same code as `sharpcheck gate`; the terminal summary lists the worst checks.

Enable with `pytest -p sharpcheck.pytest_plugin` (or `pytest_plugins = ["sharpcheck.pytest_plugin"]`
in a conftest.py). Under pytest-xdist (`-n N`) each worker hands its checks to the controller when
it finishes, and the controller alone writes the report and the summary: one report for the run,
every check in it, in worker order and within a worker in the order the checks ran."""

from __future__ import annotations

import json
import signal
from typing import Any, Dict, List

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


def _interrupt_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: Any) -> None:
    _asserts.recording = True
    if _is_worker(config):
        return
    # SIGTERM (a CI timeout, a job cancelled) and SIGHUP (a closed terminal or SSH session) stop the
    # run as Ctrl-C does, so the checks made so far reach the report (marked "complete": false)
    # instead of the process dying with none written. A handler the user installed is kept.
    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, _interrupt_on_sigterm)
    # An unwritable report path is a usage error before the run, not a traceback after all the work.
    for option in ("--sharpcheck-report", "--sharpcheck-junit"):
        path = config.getoption(option)
        if path is not None:
            try:
                _sharpcheck.check_writable(path)
            except OSError as error:
                raise pytest.UsageError(f"{option}: {error}") from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any):  # type: ignore[no-untyped-def]
    _asserts.current_test = item.nodeid
    try:
        yield
    finally:
        _asserts.current_test = None


# Checks handed over by pytest-xdist workers (controller only), by worker id.
_FROM_WORKERS: Dict[str, List[dict]] = {}


def _is_worker(config: Any) -> bool:
    return hasattr(config, "workerinput")


def _records() -> List[dict]:
    entries = [dict(entry["record"]) for entry in _asserts.RECORDED]
    for worker in sorted(_FROM_WORKERS):
        entries.extend(_FROM_WORKERS[worker])
    for position, record in enumerate(entries):
        record["index"] = position  # the report's order: the order the checks ran
    return entries


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, controller: a worker finished; keep the checks it made."""
    shipped = getattr(node, "workeroutput", {}).get("sharpcheck_records")
    if shipped:
        worker = str(getattr(node, "workerinput", {}).get("workerid", len(_FROM_WORKERS)))
        _FROM_WORKERS[worker] = json.loads(shipped)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    config = session.config
    if _is_worker(config):  # the controller writes the one report
        config.workeroutput["sharpcheck_records"] = json.dumps([dict(e["record"]) for e in _asserts.RECORDED])
        return
    cases = json.dumps(_records())
    # Each report is written on its own: one that fails (the disk filled during the run) does not
    # cost the other, and the failure is a message and a usage-error exit, not a traceback.
    complete = exitstatus != pytest.ExitCode.INTERRUPTED
    for option, render in (("--sharpcheck-report", lambda c: _sharpcheck.report_json(c, complete)),
                           ("--sharpcheck-junit", _sharpcheck.junit_xml)):
        path = config.getoption(option)
        if not path:
            continue
        try:
            _sharpcheck.write_report(path, render(cases))
        except OSError as error:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"sharpcheck: {option}: {error}", red=True)
            session.exitstatus = pytest.ExitCode.USAGE_ERROR


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    records = _records()
    if not records or _is_worker(config):
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
