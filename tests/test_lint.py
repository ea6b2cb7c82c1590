"""Static checks run with the tests: ruff on everything, mypy --strict on the package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]')")
def test_ruff() -> None:
    result = subprocess.run(
        ["ruff", "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_does_not_import_torch() -> None:
    code = "import sys, trainplan, trainplan.cli, trainplan.predict; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
