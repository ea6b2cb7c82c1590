"""A ``torchrun`` command line that launches torchtitan's trainer with the plan's settings.

The launcher flags are those of PyTorch's ``torch/distributed/run.py::get_args_parser``
(torch 2.13): ``--nnodes``, ``--nproc-per-node``, ``--rdzv-backend``, ``--rdzv-endpoint``,
``--rdzv-id``, ``--node-rank`` is not needed with c10d rendezvous. The trainer is
``-m torchtitan.train`` (torchtitan 0.2.2, ``torchtitan/train.py``) and its settings are
passed as ``--section.key value`` overrides, the command-line form of the job config that
``torchtitan/config/manager.py::ConfigManager`` parses (see :mod:`trainplan.export.torchtitan`
for every key). The command is self-contained: no job config file is needed.
"""

from __future__ import annotations

from typing import Final

from trainplan.export import torchtitan
from trainplan.export._common import shell_command
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

RDZV_PORT: Final = 29500


def build_argv(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[list[str], tuple[str, ...]]:
    """``argv`` of the launch (starting with ``torchrun``) and the warnings of the torchtitan export."""
    config, facts, warnings = torchtitan.build_config(system, model, recipe, layout)
    argv = ["torchrun", "--nnodes", str(facts.num_nodes), "--nproc-per-node", str(facts.nproc_per_node)]
    if facts.num_nodes > 1:
        argv += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"$MASTER_ADDR:{RDZV_PORT}",
            "--rdzv-id",
            "trainplan",
        ]
        warnings = (*warnings, "multi-node: run the same command on every node with MASTER_ADDR set")
    else:
        argv += ["--standalone"]
    argv += ["-m", "torchtitan.train", *torchtitan.cli_overrides(config)]
    return argv, warnings


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    argv, warnings = build_argv(system, model, recipe, layout)
    header = (
        f"# torchrun (torch 2.13) launching torchtitan {torchtitan.VERSION}, written by trainplan\n"
        f"# {model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}\n"
    )
    # A model outside torchtitan's flavor tables: the module that registers it, written by the
    # script itself (a quoted here-document, so the shell expands nothing in it) and importable
    # from the working directory.
    module = "".join(
        f"cat > {name} <<'TRAINPLAN_EOF'\n{text}TRAINPLAN_EOF\n"
        for name, text in torchtitan.companion_files(system, model, recipe, layout)
    )
    if module:
        module += 'export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"\n'
    return header + module + shell_command(argv, lambda w: w.startswith("-")), warnings
