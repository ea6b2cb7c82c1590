"""Every generated output in the repository, rebuilt from the current code in dependency order.

    python scripts/regenerate.py

1. ``src/trainplan/data/bands.json`` and ``docs/validation.md``: ``trainplan validate --bands
   --markdown docs/validation.md`` (the bands are read by every later output);
2. the engines table in docs/engines.md (``trainplan.engines.engines_markdown``);
3. the input fields table in docs/api.md (``trainplan.inputs.fields_markdown``);
4. the κ column of docs/timing.md's calibration table (``validate.calibrate.rewrite_kappa_cells``);
5. the entries, offerings and unpriced tables in docs/hardware.md (``trainplan.hardware.render``);
6. the example outputs in README.md and docs/*.md (``scripts/docs_examples.py --write``).

Each has a test that fails when the committed text differs from a regeneration (tests/test_bands.py,
tests/test_engines.py, tests/test_api.py, tests/test_hardware.py, tests/test_docs_examples.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def replace_between(path: Path, start: str, end: str, body: str) -> bool:
    """Put ``body`` between the marker lines ``start`` and ``end``; True when the file changed."""
    text = path.read_text(encoding="utf-8")
    head, sep, rest = text.partition(start + "\n")
    if not sep or end not in rest:
        raise SystemExit(f"{path}: markers {start!r} … {end!r} not found")
    _, _, tail = rest.partition(end)
    new = head + start + "\n" + body + end + tail
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main() -> int:
    python = sys.executable
    bands = ROOT / "src" / "trainplan" / "data" / "bands.json"
    validate = [
        python,
        "-c",
        "import sys; from trainplan.cli import main; sys.exit(main())",
        "validate",
        "--bands",
        "--markdown",
        str(ROOT / "docs" / "validation.md"),
    ]
    # the report's claims section is priced with the bands loaded at start: when the bands change,
    # a second pass writes the report with the new ones
    for _ in range(2):
        before = bands.read_bytes()
        done = subprocess.run(validate, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
            return done.returncode
        if bands.read_bytes() == before:
            break
    print("bands and docs/validation.md regenerated")
    from trainplan import inputs
    from trainplan.engines import engines_markdown

    changed = replace_between(
        ROOT / "docs" / "engines.md",
        "<!-- engines: generated -->",
        "<!-- end of engines -->",
        engines_markdown(),
    )
    print(f"docs/engines.md engines table {'rewritten' if changed else 'unchanged'}")
    changed = replace_between(
        ROOT / "docs" / "api.md",
        "<!-- fields: generated -->",
        "<!-- end of fields -->",
        inputs.fields_markdown(),
    )
    print(f"docs/api.md fields table {'rewritten' if changed else 'unchanged'}")
    from trainplan.validate.calibrate import rewrite_kappa_cells

    timing_md = ROOT / "docs" / "timing.md"
    text = timing_md.read_text(encoding="utf-8")
    table = text.split("<!-- kappa: generated -->\n", 1)[1].split("<!-- end of kappa -->", 1)[0]
    changed = replace_between(
        timing_md, "<!-- kappa: generated -->", "<!-- end of kappa -->", rewrite_kappa_cells(table)
    )
    print(f"docs/timing.md kappa column {'rewritten' if changed else 'unchanged'}")
    from trainplan.hardware import render
    from trainplan.hardware.catalog import builtin_accelerators

    accs = builtin_accelerators()
    for table, build in (
        ("entries", render.entries_markdown),
        ("offerings", render.offerings_markdown),
        ("unpriced", render.unpriced_markdown),
    ):
        changed = replace_between(
            ROOT / "docs" / "hardware.md",
            f"<!-- {table}: generated -->",
            f"<!-- end of {table} -->",
            build(accs),
        )
        print(f"docs/hardware.md {table} table {'rewritten' if changed else 'unchanged'}")
    return subprocess.run(
        [python, str(ROOT / "scripts" / "docs_examples.py"), "--write"], cwd=ROOT, check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
