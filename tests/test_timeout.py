"""The suite's guard against a hang (pyproject.toml: pytest-timeout, 900 s, the thread method): a test still
running at its limit prints every thread's stack, naming where it waits, and ends the run."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_suite_has_a_time_limit_per_test():
    res = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=100)
    assert "--timeout=TIMEOUT" in res.stdout  # the plugin is installed (the test extras name it)
    ini = (ROOT / "pyproject.toml").read_text()
    assert "\ntimeout = 900\ntimeout_method = \"thread\"\n" in ini


def test_a_hanging_test_ends_the_run_with_its_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\n\ndef test_waits():\n    time.sleep(120)\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                          str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2",
                          str(tmp_path / "test_hang.py")], capture_output=True, text=True, timeout=100)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out  # ended at 2 s: the 120 s sleep would have run past the 100 s allowed here
    assert "Timeout" in out and "in test_waits" in out, out
