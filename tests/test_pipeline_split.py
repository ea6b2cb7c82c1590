"""Pipeline splits where the embedding and the LM head take a layer's place (Llama 3 405B)."""

from __future__ import annotations

import pytest

from trainplan.errors import LayoutError
from trainplan.flops import device_flops
from trainplan.layout import Layout, stage_layers
from trainplan.memory import candidate_stages, memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import Recipe
from trainplan.sharding import device_params


def test_llama3_405b_layout() -> None:
    """126 layers, pp 16, v 8, both in the split: the first chunk holds only the embedding, the
    last only the head, the first and last stage one layer fewer (Llama 3 paper Sec. 3.3.2)."""
    stages = stage_layers(126, 16, 8, True, True)
    assert [len(s) for s in stages] == [7] + [8] * 14 + [7]
    assert sorted(i for s in stages for i in s) == list(range(126))
    # chunk c = stage c mod 16; chunk 0 (stage 0) is empty, chunk 1 (stage 1) holds layer 0
    assert stages[1][0] == 0 and stages[0][0] == 15
    # chunk 127 (stage 15) is empty: stage 15 ends with chunk 111 (layer 110), chunk 126 (stage 14)
    # holds the last layer
    assert stages[15][-1] == 110 and stages[14][-1] == 125


def test_without_the_split_the_chunks_outnumber_the_layers() -> None:
    with pytest.raises(LayoutError, match=r"128 chunks exceed 126 layers.*--pp-split-embedding"):
        stage_layers(126, 16, 8)


def test_megatron_even_split_with_embedding() -> None:
    """Megatron-Core: num_layers + 1 divided by pp, the first stage builds one fewer."""
    assert [len(s) for s in stage_layers(7, 2, 1, True, False)] == [3, 4]
    assert [len(s) for s in stage_layers(7, 2, 1, False, True)] == [4, 3]
    assert stage_layers(8, 2) == ((0, 1, 2, 3), (4, 5, 6, 7))  # unchanged without the flags


def test_split_needs_a_pipeline() -> None:
    with pytest.raises(LayoutError, match="needs pp > 1"):
        Layout(pp_split_embedding=True)


def test_memory_flops_and_params_read_the_same_split() -> None:
    model = load_model("llama-3.1-405b")
    layout = Layout(
        dp=1,
        tp=8,
        pp=16,
        zero=1,
        pp_schedule="interleaved",
        virtual_stages=8,
        pp_split_embedding=True,
        pp_split_head=True,
    )
    recipe = Recipe(seq_len=8192, global_batch=16)
    assert [len(device_params(model, layout, r).layers) for r in (0, 1, 15)] == [7, 8, 7]
    work = device_flops(model, recipe, layout)
    assert [len(s.layers) for s in work] == [7] + [8] * 14 + [7]
    busiest = max(work, key=lambda s: s.micro_batch_flops)
    assert len(busiest.layers) == 8
    # a middle stage (8 layers) competes for the memory peak with the first and the last
    assert 1 in candidate_stages(model, layout)
    mem = memory_breakdown(model, recipe, layout)
    assert mem.stage in candidate_stages(model, layout)


def _llama3_405b_export(target: str, zero: int) -> tuple[object, ...]:
    from trainplan.export import megatron as mlm_export
    from trainplan.export import torchtitan as tt_export
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System

    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8192)
    model = load_model("llama-3.1-405b")
    recipe = Recipe(seq_len=8192, global_batch=2048)
    layout = Layout.for_devices(
        8192,
        tp=8,
        pp=16,
        zero=zero,
        sequence_parallel=True,
        pp_schedule="interleaved",
        virtual_stages=8,
        pp_split_embedding=True,
        pp_split_head=True,
    )
    if target == "megatron":
        return tuple(mlm_export.build_argv(system, model, recipe, layout)[0])
    config, _, _ = tt_export.build_config(system, model, recipe, layout)
    return (config["parallelism"],)


def test_exports_write_the_split() -> None:
    """Megatron-LM gets account_for_embedding/loss_in_pipeline_split; torchtitan's pipeline_llm
    builds 128 one-unit stages with the embedding and the output as a unit each (its default
    first/last-stage weight of 1), the split layout.stage_layers counts."""
    argv = _llama3_405b_export("megatron", 1)
    assert "--account-for-embedding-in-pipeline-split" in argv
    assert "--account-for-loss-in-pipeline-split" in argv
    (par,) = _llama3_405b_export("torchtitan", 2)  # Llama 3's FSDP kept weights unsharded
    assert isinstance(par, dict)
    assert par["pipeline_parallel_layers_per_stage"] == 1
    assert par.get("pipeline_parallel_first_stage_less_layers", 1) == 1
