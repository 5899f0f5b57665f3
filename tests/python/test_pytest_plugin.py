"""The pytest plugin: a run's checks land in one gate-style JSON report and JUnit XML, failing
checks among them, and the terminal summary lists the worst; without the plugin nothing is written."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

TESTS = '''
import torch, sharpcheck

def test_passes():
    x = torch.randn(4, 256)
    sharpcheck.assert_softmax_close(torch.softmax(x, -1), x)

def test_fails():
    x = torch.randn(4, 256)
    sharpcheck.assert_softmax_close(torch.softmax(x, -1) * 1.01, x)

def test_attention():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    sharpcheck.assert_attention_close(sharpcheck.attention(q, k, v), q, k, v)
'''


def run_pytest(tmp_path, *options):
    (tmp_path / "test_user.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), *options],
                          capture_output=True, text=True, env=env, cwd=tmp_path)


def test_the_plugin_writes_every_check_as_the_gates_report_and_junit(tmp_path):
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    result = run_pytest(tmp_path, "-p", "sharpcheck.pytest_plugin", f"--sharpcheck-report={report}",
                        f"--sharpcheck-junit={junit}")
    assert result.returncode == 1, result.stdout + result.stderr  # test_fails fails
    cases = json.loads(report.read_text())["cases"]
    assert [c["status"] for c in cases] == ["pass", "fail", "pass"]
    assert cases[1]["kernel"].endswith("test_user.py::test_fails")
    assert cases[1]["rerun"].startswith("pytest ") and cases[1]["worst"]["full_index"]
    assert "tolerance table" in cases[1]["failures"][0]
    suites = ElementTree.parse(junit).getroot()
    assert sum(int(s.get("failures")) for s in suites.iter("testsuite")) == 1
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "checks against the correctly rounded reference" in line)
    assert "3 checks against the correctly rounded reference: 1 failed" in lines[header]
    worst_first = lines[header + 1]  # the summary lists the worst checks, the failing one first
    assert worst_first.split()[0] == "fail" and "test_user.py::test_fails" in worst_first, result.stdout


NONCHARACTER_TESTS = '''
import torch, sharpcheck

def test_named():
    x = torch.randn(2, 16)
    sharpcheck.assert_softmax_close(torch.softmax(x, -1) * 1.01, x, name="kernel \\ufffe \\uffff \\x01 end")
'''


def test_a_name_holding_xml_noncharacters_still_gives_a_junit_file_parsers_read(tmp_path):
    """From issue 33's round: U+FFFE in a check's name (valid UTF-8, not an XML 1.0 character) made
    the JUnit file unreadable to every XML parser; such characters are replaced as the C0 controls are."""
    (tmp_path / "test_user.py").write_text(NONCHARACTER_TESTS)
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                             "sharpcheck.pytest_plugin", f"--sharpcheck-junit={junit}", str(tmp_path)],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    text = junit.read_text(encoding="utf-8")
    assert "\ufffe" not in text and "\uffff" not in text and "\x01" not in text
    suites = ElementTree.parse(junit).getroot()
    names = [case.get("name") + case.get("classname") for case in suites.iter("testcase")]
    assert any("kernel \ufffd \ufffd \ufffd end" in name for name in names), names


def test_without_the_plugin_no_report_is_written(tmp_path):
    result = run_pytest(tmp_path)
    assert result.returncode == 1
    assert "checks against the correctly rounded reference" not in result.stdout
    assert not (tmp_path / "report.json").exists()


def test_an_unwritable_report_path_is_an_error_naming_it(tmp_path):
    result = run_pytest(tmp_path, "-p", "sharpcheck.pytest_plugin",
                        "--sharpcheck-report=/nonexistent-directory/report.json")
    assert result.returncode != 0
    assert "/nonexistent-directory/report.json" in result.stdout + result.stderr
    # Refused before the run, as a usage error naming it, with no traceback (it used to run every
    # test, then fail with a 19-frame traceback and never write the JUnit file).
    assert result.returncode == 4
    assert "Traceback" not in result.stdout + result.stderr
    assert "passed" not in result.stdout


def test_under_xdist_the_controller_writes_one_report_with_every_workers_checks(tmp_path):
    """pytest -n 2: each worker's checks reach the controller, which alone writes the report (a
    worker writing its own would leave a report holding one worker's checks, or a torn file)."""
    pytest = __import__("pytest")
    pytest.importorskip("xdist")
    report = tmp_path / "report.json"
    result = run_pytest(tmp_path, "-n", "2", "-p", "sharpcheck.pytest_plugin", f"--sharpcheck-report={report}")
    assert result.returncode == 1, result.stdout + result.stderr  # test_fails fails
    cases = json.loads(report.read_text())["cases"]
    assert sorted(c["status"] for c in cases) == ["fail", "pass", "pass"], cases
    assert [c["index"] for c in cases] == [0, 1, 2]
    assert "3 checks against the correctly rounded reference: 1 failed" in result.stdout, result.stdout


SLOW_TESTS = '''
import pathlib, time, torch, sharpcheck

def test_checked():
    x = torch.randn(4, 64)
    sharpcheck.assert_softmax_close(torch.softmax(x, -1), x)
    pathlib.Path("checked.flag").write_text("done")

def test_slow():
    time.sleep(60)
'''


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_sigterm_keeps_the_checks_made_so_far_in_a_report_marked_incomplete(tmp_path, signal_name):
    """A CI job cancelled mid-run (SIGTERM) or a closed terminal (SIGHUP): the report and the JUnit
    file hold the checks already made, and the report says "complete": false (before, the process
    died and wrote neither; SIGHUP did until issue 33's third round)."""
    import signal
    import time
    (tmp_path / "test_slow_user.py").write_text(SLOW_TESTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    process = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                                "sharpcheck.pytest_plugin", "--sharpcheck-report=r.json", "--sharpcheck-junit=r.xml",
                                "test_slow_user.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (tmp_path / "checked.flag").exists():
        assert time.monotonic() < deadline and process.poll() is None, "the first test never finished"
        time.sleep(0.1)
    time.sleep(0.5)
    process.send_signal(getattr(signal, signal_name))
    process.communicate(timeout=60)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report.get("complete") is False
    assert len(report["cases"]) == 1 and report["cases"][0]["status"] == "pass"
    assert (tmp_path / "r.xml").exists()
