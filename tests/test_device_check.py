"""The prepared GPU check: every plan in it is one `trainplan run` accepts, and it needs CUDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainplan.api import estimate_inputs
from trainplan.cli import build_parser
from trainplan.predict import estimate
from trainplan.run.config import check_supported

ROOT = Path(__file__).resolve().parents[1]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "benchmarks" / "device_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", [name for name, _ in _module().CASES])
def test_every_case_is_a_runnable_single_gpu_plan_that_fits_an_h200(case: str) -> None:
    flags = dict(_module().CASES)[case]
    args = build_parser().parse_args(["estimate", *flags, "--hardware", "h200", "--devices", "1"])
    system, model, recipe, layout = estimate_inputs(vars(args))
    check_supported(model, recipe, layout)  # what `trainplan run` refuses before spawning
    est = estimate(system, model, recipe, layout)
    assert est.feasible, est.reasons


def test_without_cuda_it_says_so_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = _module()
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    except ImportError:
        pass
    assert mod.main(["--out", str(tmp_path)]) == 2
    assert "device_check:" in capsys.readouterr().err
    assert not (tmp_path / "device_measurements.jsonl").exists()
    assert "device_check" not in sys.modules or sys.modules["device_check"] is not mod
