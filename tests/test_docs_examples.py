"""Every example output in README.md and docs/ is what the current code prints
(scripts/docs_examples.py; regenerate with ``python scripts/docs_examples.py --write``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docs_examples.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("docs_examples", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["docs_examples"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_there_are_examples_to_check() -> None:
    mod = _module()
    found = [ex for path in mod.files() for ex in mod.examples(path)]
    assert len(found) >= 6
    assert any(ex.command.startswith("trainplan plan ") for ex in found)


def test_committed_examples_match_the_code() -> None:
    diffs = _module().check()
    assert not diffs, (
        "docs examples differ; run `python scripts/docs_examples.py --write`:\n\n" + "\n\n".join(diffs)
    )


def test_a_changed_output_is_caught(tmp_path: Path) -> None:
    mod = _module()
    doc = tmp_path / "x.md"
    doc.write_text(
        "```\n$ trainplan models --json | head -c 1\n[\n```\n\n```\n$ trainplan models | head -1\nnot this\n```\n"
    )
    exs = mod.examples(doc)
    assert len(exs) == 2
    assert mod.normalise(mod.run(exs[0].command)) == mod.normalise(exs[0].expected)
    assert mod.normalise(mod.run(exs[1].command)) != mod.normalise(exs[1].expected)
