"""The Python API (trainplan.estimate / plan / compare) against the CLI's --json, and its docs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainplan
from trainplan import inputs
from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.predict import Estimate
from trainplan.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def roundtrip(d: object) -> Any:
    return json.loads(json.dumps(d, sort_keys=True))


def without_seconds(d: Any) -> Any:
    d["search"].pop("seconds")
    return d


ESTIMATES = [
    (
        {"devices": 8, "zero": 3, "tokens": 1e9},
        ["--devices", "8", "--zero", "3", "--tokens", "1e9"],
    ),
    (
        {"method": "qlora", "lora_rank": 8, "lora_targets": "q,v", "seq_len": 2048, "recompute": "full"},
        [
            "--method",
            "qlora",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--seq-len",
            "2048",
            "--recompute",
            "full",
        ],
    ),
    (
        {"devices": 16, "tp": 4, "pp": 2, "sequence_parallel": True, "no_master_weights": True, "price": 2.5},
        [
            "--devices",
            "16",
            "--tp",
            "4",
            "--pp",
            "2",
            "--sequence-parallel",
            "--no-master-weights",
            "--price",
            "2.5",
        ],
    ),
]


@pytest.mark.parametrize(("kw", "argv"), ESTIMATES, ids=["zero3", "qlora", "tp-pp"])
def test_estimate_equals_the_cli_json(
    capsys: pytest.CaptureFixture[str], kw: dict[str, object], argv: list[str]
) -> None:
    est = trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", **kw)
    assert isinstance(est, Estimate)
    assert roundtrip(est.to_dict()) == cli_json(
        capsys, "estimate", "llama-3.1-8b", "--hardware", "h100-sxm", *argv
    )


def test_typed_inputs_give_the_same_estimate() -> None:
    by_keyword = trainplan.estimate(
        "llama-3.1-8b", hardware="h100-sxm", devices=8, zero=3, method="full", global_batch=64, tokens=1e9
    )
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    recipe = Recipe(method="full", global_batch=64, tokens=1e9)
    typed = trainplan.estimate(
        load_model("llama-3.1-8b"), hardware=system, recipe=recipe, layout=Layout(dp=8, zero=3)
    )
    # typed inputs carry their settings themselves: no engine filled any of them
    keyword_dict = by_keyword.to_dict()
    assert keyword_dict.pop("engine")["name"] == "megatron"
    assert "engine" not in typed.to_dict()
    assert typed.to_dict() == keyword_dict
    # an Accelerator with a Layout: the device count is the layout's
    acc = trainplan.estimate(
        "llama-3.1-8b", hardware=system.accelerator, recipe=recipe, layout=Layout(dp=8, zero=3)
    )
    assert acc.to_dict() == keyword_dict


def test_plan_equals_the_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = trainplan.plan(
        "llama-3.1-70b", method="full", tokens=1e10, hardware=["h100-sxm", "h200"], max_devices=64
    )
    want = cli_json(
        capsys, "plan", "llama-3.1-70b", "--method", "full", "--tokens", "1e10", "--hardware", "h100-sxm,h200",
        "--max-devices", "64",
    )  # fmt: skip
    assert without_seconds(roundtrip(result.to_dict())) == without_seconds(want)
    assert result.fastest is not None and result.fastest.estimate.recipe.method == "full"


def test_compare_equals_the_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    result = trainplan.compare("llama-2-7b", hardware="h100,mi300x", devices=8, tokens=1e11, micro_batch=2)
    want = cli_json(
        capsys, "compare", "llama-2-7b", "--hardware", "h100,mi300x", "--devices", "8", "--tokens", "1e11",
        "--micro-batch", "2",
    )  # fmt: skip
    assert without_seconds(roundtrip(result.to_dict())) == without_seconds(want)
    assert [b.hardware for b in result.per_accelerator] == [b["hardware"] for b in want["hardware"]]


@pytest.mark.parametrize(
    ("call", "field", "says"),
    [
        (lambda: trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", zer0=3), "zer0", "'zero'"),
        (
            lambda: trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", max_devices=8),
            "max_devices",
            "unknown",
        ),
        (lambda: trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", tp=0), "tp", "positive"),
        (
            lambda: trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", precision="fp7"),
            "precision",
            "fp7",
        ),
        (
            lambda: trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", recipe=Recipe(), seq_len=2048),
            "seq_len",
            "recipe=",
        ),
        (lambda: trainplan.plan("llama-3.1-8b", zero=3), "zero", "unknown"),
        (lambda: trainplan.compare("llama-3.1-8b", hardware=[]), "hardware", "at least one"),
    ],
)
def test_bad_keywords_are_typed_errors_naming_them(call: Any, field: str, says: str) -> None:
    with pytest.raises(TrainplanError) as err:
        call()
    assert err.value.field == field and says in err.value.message, err.value


def test_the_functions_survive_importing_every_submodule() -> None:
    code = """
import importlib, pkgutil, trainplan
for info in pkgutil.walk_packages(trainplan.__path__, "trainplan."):
    if info.name.endswith(".__main__"):  # running them would start a command
        continue
    try:
        importlib.import_module(info.name)
    except ImportError:  # modules that need torch
        pass
import trainplan.predict
from trainplan import estimate
assert estimate is trainplan.estimate and callable(estimate), trainplan.estimate
est = trainplan.estimate("gpt2", hardware="h100-sxm", seq_len=1024)
assert type(est).__name__ == "Estimate" and est.memory.fits
assert callable(trainplan.plan) and callable(trainplan.compare)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# --- the docs ---------------------------------------------------------------------------------------
def test_docs_api_lists_every_field() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    table = text.split("<!-- fields: generated -->\n", 1)[1].split("<!-- end of fields -->", 1)[0]
    assert table == inputs.fields_markdown(), "docs/api.md is out of date: regenerate its table (see there)"
    listed = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))
    assert listed == {f.name for fields in inputs.COMMANDS.values() for f in fields}
    for name in ("estimate", "plan", "compare"):
        assert f"trainplan.{name}(model" in text


@pytest.mark.parametrize(("doc", "heading"), [("README.md", "## Python"), ("docs/api.md", "# Python API")])
def test_the_documented_usage_runs(doc: str, heading: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks and "trainplan.estimate(" in blocks[0] and "trainplan.plan(" in blocks[0]
    result = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
