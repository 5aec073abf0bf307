"""tests/conftest.py's rule for optional packages: a test skipped for a package it could not import is a skip where
the extras are optional, and fails the run under `make test` (SKIPLAB_REQUIRE_EXTRAS=1), naming the test; a skip
for anything else (no java, no data) stays a skip either way."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REQUIRE_EXTRAS

ROOT = Path(__file__).resolve().parents[1]
HOOKS = "pytest_collectreport, pytest_runtest_logreport, pytest_sessionfinish, pytest_terminal_summary"


def run_suite(folder: Path, required: bool) -> subprocess.CompletedProcess:
    folder.mkdir(exist_ok=True)
    (folder / "conftest.py").write_text(f"from tests.conftest import {HOOKS}  # noqa: F401\n")
    (folder / "test_inside.py").write_text(
        "import pytest\n\n\n"
        "def test_needs_a_package():\n    pytest.importorskip('skiplab_absent_package')\n\n\n"
        "def test_needs_java():\n    pytest.skip('no java on PATH')\n\n\n"
        "def test_plain():\n    assert True\n")
    (folder / "test_module.py").write_text(
        "import pytest\n\nreference = pytest.importorskip('skiplab_absent_reference')\n\n\n"
        "def test_against_it():\n    assert reference\n")
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_EXTRAS}
    env["PYTHONPATH"] = str(ROOT)
    if required:
        env[REQUIRE_EXTRAS] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
                           str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_a_missing_package_is_a_skip_where_the_extras_are_optional(tmp_path):
    done = run_suite(tmp_path / "suite", required=False)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed, 3 skipped" in done.stdout and "optional packages missing" not in done.stdout


def test_a_missing_package_fails_the_run_under_make_test_naming_each_test(tmp_path):
    done = run_suite(tmp_path / "suite", required=True)
    assert done.returncode == 1, done.stdout[-2000:]
    section = done.stdout.split("optional packages missing", 1)[1]
    named = sorted(line.split(": ")[0] for line in section.splitlines() if line.startswith("test_"))
    assert named == ["test_inside.py::test_needs_a_package", "test_module.py"]  # not the test without java
    assert "test_module.py: could not import 'skiplab_absent_reference'" in section
