"""The example outputs in README.md and docs/*.md, run against the current code.

An example is a fenced block whose first line is ``$ trainplan ARGS`` (continued over lines that
end in ``\\``), optionally piped into a shell filter (``$ trainplan ARGS | grep -E '...'``, to show
an excerpt), or ``$ cat FILE`` of a file an earlier example of the page wrote; the rest of the
block is that command's output. Run:

    python scripts/docs_examples.py            # check: exit 1 and a diff when any example differs
    python scripts/docs_examples.py --write    # rewrite every example's output from the code

Each command runs in this process (``trainplan.cli.main``), stdout and stderr together. Wall-clock
figures the planner prints (``searched N candidates in 0.21 s``) are compared as ``<t> s``.
``trainplan run`` examples are measurements of a real training loop on the machine that ran them
(docs/run.md): they are shown as measured and not re-run.
tests/test_docs_examples.py runs the check.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = "```"
_TIMING = re.compile(r"(candidates in )\d+(?:\.\d+)?( s)")


@dataclass(frozen=True)
class Example:
    path: Path
    start: int  # index of the block's first line ("$ trainplan ...") in the file's lines
    end: int  # index of its closing fence
    command: str  # the whole command, continuations joined
    expected: str  # the committed output

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.start + 1}"


def files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples(path: Path) -> list[Example]:
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[Example] = []
    i = 0
    while i < len(lines):
        if (
            lines[i].startswith(FENCE)
            and i + 1 < len(lines)
            and lines[i + 1].startswith(("$ trainplan ", "$ cat "))
        ):
            start = i + 1
            j = start
            parts = [lines[j][2:]]
            while parts[-1].endswith("\\") and j + 1 < len(lines):
                parts[-1] = parts[-1][:-1]
                j += 1
                parts.append(lines[j].strip())
            end = j + 1
            while end < len(lines) and not lines[end].startswith(FENCE):
                end += 1
            command = " ".join(p.strip() for p in parts)
            if command.startswith("trainplan run "):
                i = end + 1
                continue
            out.append(Example(path, start, end, command, "\n".join(lines[j + 1 : end])))
            i = end + 1
            continue
        i += 1
    return out


def run(command: str) -> str:
    """The output of one example's command, as a terminal would show it. ``cat FILE`` shows a
    file an earlier example of the same page wrote (examples run in page order)."""
    from trainplan.cli import main

    if command.startswith("cat "):
        return Path(shlex.split(command)[1]).read_text(encoding="utf-8").rstrip("\n")

    words = command.split(" | ", 1)
    argv = shlex.split(words[0])[1:]  # drop "trainplan"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        main(argv)
    text = buf.getvalue()
    if len(words) == 2:
        text = subprocess.run(
            ["bash", "-c", words[1]], input=text, capture_output=True, text=True, check=False
        ).stdout
    return text.rstrip("\n")


def normalise(text: str) -> str:
    return _TIMING.sub(r"\1<t>\2", text.rstrip("\n"))


def check() -> list[str]:
    """One unified diff per example whose committed output differs from the code's."""
    diffs = []
    for path in files():
        for ex in examples(path):
            actual = run(ex.command)
            if normalise(actual) != normalise(ex.expected):
                diff = difflib.unified_diff(
                    ex.expected.split("\n"), actual.split("\n"), "committed", "current code", lineterm="", n=1
                )
                diffs.append(f"{ex.where}: $ {ex.command}\n" + "\n".join(list(diff)[:40]))
    return diffs


def write() -> int:
    """Rewrite every example's output; returns how many changed."""
    changed = 0
    for path in files():
        exs = examples(path)
        if not exs:
            continue
        lines = path.read_text(encoding="utf-8").split("\n")
        outputs = [run(ex.command) for ex in exs]  # in page order: a `cat` reads what ran before it
        for ex, actual in reversed(list(zip(exs, outputs, strict=True))):
            if normalise(actual) == normalise(ex.expected):
                continue
            # the command may span several lines: its output starts after the last of them
            j = ex.start
            while lines[j].endswith("\\"):
                j += 1
            first_output = j + 1
            lines[first_output : ex.end] = actual.split("\n") if actual else []
            changed += 1
        path.write_text("\n".join(lines), encoding="utf-8")
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the outputs from the code")
    args = parser.parse_args()
    if args.write:
        print(f"{write()} example(s) rewritten")
        return 0
    diffs = check()
    for d in diffs:
        print(d, end="\n\n")
    print(f"{len(diffs)} example(s) differ" if diffs else "every example matches the code")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
