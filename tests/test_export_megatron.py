"""The Megatron-LM target, plans to exports (``plan --export``, ``export --plan``), ``--tokens`` as
the step count, and refusals that name a target which does write the plan."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.export import TARGETS, export_plan
from trainplan.export.megatron import build_argv, megatron_args
from trainplan.export.saved import export_or_explain, read_plan, targets_for
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

# Megatron-LM's flags that the target writes, as megatron/training/arguments.py (core_r0.14.0)
# declares them: those taking a value, and the switches (store_true / store_false).
VALUED = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--normalization",
    "--position-embedding-type", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-token-dispatcher-type", "--moe-shared-expert-intermediate-size", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank", "--data-parallel-sharding-strategy", "--ckpt-format",
    "--micro-batch-size", "--global-batch-size", "--fp8-format", "--fp4-format", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--attention-backend", "--attention-dropout",
    "--hidden-dropout", "--optimizer", "--sgd-momentum", "--optimizer-offload-fraction", "--tokenizer-type",
    "--vocab-size", "--train-iters", "--lr-decay-iters", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--moe-layer-freq", "--window-size", "--window-attn-skip-freq",
}  # fmt: skip
SWITCHES = {
    "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--add-qkv-bias", "--qk-layernorm", "--moe-grouped-gemm", "--sequence-parallel",
    "--no-overlap-p2p-communication", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--no-gradient-accumulation-fusion",
    "--bf16", "--fp16", "--optimizer-cpu-offload", "--mock-data", "--multi-latent-attention",
    "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
}  # fmt: skip
CHOICES = {
    "--normalization": {"LayerNorm", "RMSNorm"},
    "--position-embedding-type": {"learned_absolute", "rope", "none"},
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},
    "--recompute-granularity": {"full", "selective"},
    "--recompute-method": {"uniform", "block"},
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},
    "--fp8-format": {"e4m3", "hybrid"},
    "--optimizer": {"adam", "sgd"},
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
}


def _tuple_type(text: str) -> tuple[int, ...]:
    """Megatron-LM's ``tuple_type`` (arguments.py): "(1,2)" or "1,2" to a tuple of ints."""
    return tuple(int(i) for i in text.strip("()").split(","))


def megatron_parser() -> argparse.ArgumentParser:
    """A parser with the written flags' Megatron-LM declarations (type and choices)."""
    p = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    floats = {"--attention-dropout", "--hidden-dropout", "--sgd-momentum", "--optimizer-offload-fraction"}
    for flag in sorted(VALUED):
        kind: Any = (
            _tuple_type
            if flag == "--window-size"
            else float
            if flag in floats
            else (str if flag in CHOICES or flag.endswith(("-type", "-format", "-freq")) else int)
        )
        p.add_argument(flag, type=kind, choices=sorted(CHOICES[flag]) if flag in CHOICES else None)
    for flag in sorted(SWITCHES):
        p.add_argument(flag, action="store_true")
    return p


def _plan(
    model: str, devices: int, recipe: dict[str, Any] | None = None, **layout: Any
) -> tuple[System, ModelSpec, Recipe, Layout]:
    return (
        System(accelerator=get_accelerator("h100-sxm"), num_devices=devices),
        load_model(model),
        Recipe(**(recipe or {})),
        Layout.for_devices(devices, **layout),
    )


PLANS = [
    ("llama-3.1-8b", 8, {"global_batch": 64, "tokens": 1e9}, {"zero": 1}),
    ("llama-2-7b", 16, {"global_batch": 32, "recompute": "full"}, {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True, "zero": 3}),
    (
        "llama-3.1-70b",
        64,
        {"global_batch": 64, "precision": "fp8", "recompute": "selective"},
        {"tp": 4, "pp": 4, "pp_schedule": "interleaved", "virtual_stages": 5, "sequence_parallel": True, "pp_comm_overlap": True},
    ),
    ("mixtral-8x7b", 16, {"global_batch": 64, "tokens": 1e10, "offload": "optimizer"}, {"ep": 8, "zero": 1}),
    ("qwen3-30b-a3b", 8, {"global_batch": 16}, {"ep": 8, "zero": 2}),
    ("mistral-7b", 8, {"global_batch": 16, "optimizer": "sgd"}, {"pp": 2}),
    ("deepseek-v2-lite", 8, {"global_batch": 16}, {"ep": 8, "zero": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS)
def test_megatron_arguments_parse_as_megatron_declares_them(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> None:
    system, spec, rec, lay = _plan(model, devices, recipe, **layout)
    argv, facts, _ = build_argv(system, spec, rec, lay)
    args = megatron_parser().parse_args(megatron_args(argv))  # an unknown flag or bad value raises
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (lay.tp, lay.pp)
    assert args.context_parallel_size == lay.cp
    assert (args.expert_model_parallel_size or 1) == lay.ep
    assert args.sequence_parallel == lay.sequence_parallel and args.tp_comm_overlap == lay.tp_comm_overlap
    # Megatron-LM: dp = world / (tp·pp·cp), micro-batches = global / (micro · dp)
    world = facts.num_nodes * facts.nproc_per_node
    dp = world // (lay.tp * lay.pp * lay.cp)
    assert dp == lay.dp and args.global_batch_size // (args.micro_batch_size * dp) == facts.micro_batches
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (
        spec.num_layers,
        spec.hidden_size,
        spec.num_heads,
    )
    assert (args.num_query_groups or spec.num_heads) == spec.num_kv_heads
    assert args.use_distributed_optimizer == (lay.zero >= 1)
    assert args.use_megatron_fsdp == (lay.zero >= 2)
    if spec.moe is not None:
        assert (args.num_experts, args.moe_router_topk) == (spec.moe.num_experts, spec.moe.top_k)
        # Megatron's pattern: 0 = dense, 1 = MoE, one per layer
        freq = args.moe_layer_freq
        pattern = eval(freq, {"__builtins__": {}}) if freq else [1] * spec.num_layers
        assert pattern == [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]
    if spec.mla is not None:
        assert args.multi_latent_attention and args.qk_layernorm
        assert (args.q_lora_rank or 0, args.kv_lora_rank) == (spec.mla.q_lora_rank, spec.mla.kv_lora_rank)
        assert (args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim) == (
            spec.mla.qk_nope_head_dim,
            spec.mla.qk_rope_head_dim,
            spec.mla.v_head_dim,
        )
    if lay.pp_schedule == "interleaved":
        assert args.num_virtual_stages_per_pipeline_rank == lay.virtual_stages
        assert args.no_overlap_p2p_communication == (not lay.pp_comm_overlap)
    assert args.attention_dropout == 0.0 == args.hidden_dropout  # Megatron's default 0.1 is overridden
    if rec.tokens is not None:
        steps = math.ceil(rec.tokens / (facts.global_batch * rec.seq_len))
        assert args.train_iters == steps == args.lr_decay_iters
    else:
        assert args.train_iters is None


@pytest.mark.parametrize(
    ("recipe", "layout", "field"),
    [
        ({"method": "lora"}, {}, "method"),
        ({"recompute": "sac"}, {}, "recompute"),
        ({"recompute": "full", "recompute_early_stop": True}, {}, "recompute_early_stop"),
        ({"offload": "optimizer+params"}, {"zero": 3}, "offload"),
        ({"optimizer": "lion"}, {}, "optimizer"),
        ({}, {"pp": 2, "pp_schedule": "zb"}, "pp_schedule"),
        ({}, {"zero": 3, "zero3_granularity": "parameter"}, "zero3_granularity"),
        ({}, {"pp": 2, "pp_comm_overlap": True}, "pp_comm_overlap"),
    ],
)
def test_megatron_refuses_what_it_cannot_run(
    recipe: dict[str, Any], layout: dict[str, Any], field: str
) -> None:
    system, spec, rec, lay = _plan("llama-3.1-8b", 8, {"global_batch": 16, **recipe}, **layout)
    with pytest.raises(TrainplanError) as info:
        export_plan("megatron", system, spec, rec, lay)
    assert info.value.field == field


def test_tokens_become_torchtitan_steps() -> None:
    system, spec, rec, lay = _plan("llama-3.1-8b", 8, {"global_batch": 64, "tokens": 2e9}, zero=3)
    data = tomllib.loads(export_plan("torchtitan", system, spec, rec, lay).text)
    assert data["training"]["steps"] == math.ceil(2e9 / (64 * 4096)) == 7630
    untimed = _plan("llama-3.1-8b", 8, {"global_batch": 64}, zero=3)
    assert "steps" not in tomllib.loads(export_plan("torchtitan", *untimed).text)["training"]
    # a target whose file has no step count names the number
    ds = export_plan("deepspeed", system, spec, rec, lay)
    assert any("7630 optimizer steps" in w for w in ds.warnings)


def test_refusals_name_only_targets_that_write_the_plan() -> None:
    """No circle: every target a refusal names does export the plan."""
    for model, devices, recipe, layout in PLANS:
        plan = _plan(model, devices, recipe, **layout)
        can = set(targets_for(*plan))
        for target in TARGETS:
            if target in can:
                continue
            with pytest.raises(TrainplanError) as info:
                export_or_explain(target, *plan)
            message = info.value.message
            named = {
                t
                for t in TARGETS
                if f"export to {t}" in message or f" {t}," in message or message.endswith(f" {t}")
            }
            assert named <= can, (model, target, message)
            if can:
                assert (
                    "targets that can export this plan: " + ", ".join(sorted(can, key=TARGETS.index))
                    in message
                )
            else:
                assert "no export target can write this plan" in message


# --------------------------------------------------------------------------- CLI
def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# an expert-parallel plan the Megatron target can write (its optimizer offloaded, not its parameters)
MIXTRAL_PLAN = ["plan", "mixtral-8x22b", "--hardware", "h100-sxm", "--devices", "16", "--tokens", "1e10"]
MIXTRAL_PLAN += ["--offload", "optimizer"]


def test_plan_export_then_export_plan_write_the_same_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mixtral-8x22B on 16 H100: the planner's expert-parallel plan, launched by Megatron-LM."""
    script = tmp_path / "launch.sh"
    args = MIXTRAL_PLAN
    code, out, err = _run(capsys, *args, "--export", "engine", "--export-file", str(script), "--json")
    assert code == 0, err
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    data = json.loads(out)
    assert data["engine"]["export_target"] == "megatron"
    assert f"as megatron config to {script}" in err
    best = data["plans"][0]
    assert best["layout"]["ep"] > 1  # the plan the target writes is the ranked one, expert parallel
    text = script.read_text()
    assert f"--expert-model-parallel-size {best['layout']['ep']}" in text
    steps = math.ceil(1e10 / (best["recipe"]["global_batch"] * best["recipe"]["seq_len"]))
    assert f"--train-iters {steps}" in text
    code, again, err = _run(capsys, "export", "--plan", str(saved))
    assert code == 0, err
    assert again == text
    p = read_plan(data)
    assert p.layout.ep == best["layout"]["ep"] and p.recipe.tokens == 1e10


def test_plan_export_names_the_plans_it_passes_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = MIXTRAL_PLAN
    code, out, err = _run(capsys, *args, "--export", "deepspeed", "--export-file", str(tmp_path / "ds.json"))
    assert code == 2
    assert out.startswith("plan for mixtral-8x22b")  # the plan is still printed
    assert err.count("error:") == 1
    assert (
        "ranked plans can be exported to deepspeed" in err
        and "the targets that can export it: megatron" in err
    )
    assert "export to torchtitan" not in err


def test_export_defaults_to_the_engines_target(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["export", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    code, out, _ = _run(capsys, *base, "--engine", "torchtitan")
    assert code == 0 and out.startswith("# torchtitan")
    code, out, _ = _run(capsys, *base)
    assert code == 0 and "pretrain_gpt.py" in out  # the default engine, Megatron-Core
    code, _, err = _run(capsys, *base, "--engine", "torchtune")
    assert code == 2 and "the torchtune engine has no export target" in err and "--to one of" in err


def test_export_plan_takes_every_setting_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys,
        "plan",
        "llama-3.1-8b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--engine",
        "torchtitan",
        "--json",
    )
    assert code == 0, err
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    code, text, err = _run(capsys, "export", "--plan", str(saved), "--rank", "1")
    assert code == 0, err
    assert text.startswith("# torchtitan")  # the saved plan's engine gives the target
    code, _, err = _run(capsys, "export", "--plan", str(saved), "--tp", "2")
    assert code == 2 and "drop --tp" in err
    code, _, err = _run(capsys, "export", "--plan", str(saved), "--rank", "99")
    assert code == 2 and "no rank 99" in err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    code, _, err = _run(capsys, "export", "--plan", str(bad))
    assert code == 2 and "not the output of `trainplan plan --json`" in err
    code, _, err = _run(capsys, "export")
    assert code == 2 and "give a model and --hardware" in err


def test_shell_text_is_one_command() -> None:
    system, spec, rec, lay = _plan("llama-3.1-8b", 16, {"global_batch": 64}, zero=1)
    text = export_plan("megatron", system, spec, rec, lay).text
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    assert words[0] == "torchrun" and "pretrain_gpt.py" in words


def test_a_saved_plan_keeps_every_recipe_field() -> None:
    """``plan --json`` writes every recipe field and ``export --plan`` reads each back: a saved plan
    with FP8 weights still exports --fp8-param-gather, and older plans without the newer fields
    take their defaults."""
    import dataclasses
    import json

    from trainplan.export.saved import recipe_from_dict
    from trainplan.predict import recipe_to_dict
    from trainplan.recipe import Recipe

    recipe = Recipe(
        precision="fp8",
        fp8_params=True,
        fp8_activation_store=True,
        fp8_attention=True,
        recompute="full",
        recompute_layers=3,
        mtp_layers=1,
        global_batch=64,
    )
    written = recipe_to_dict(recipe)
    assert {f.name for f in dataclasses.fields(Recipe)} - set(written) == {"lora"}
    assert recipe_from_dict(json.loads(json.dumps(written))) == recipe
    old = {k: v for k, v in written.items() if k not in ("fp8_params", "fp8_attention", "recompute_layers")}
    assert recipe_from_dict(
        {**old, "precision": "bf16", "recompute": "none", "fp8_activation_store": False}
    ) == Recipe(mtp_layers=1, global_batch=64)


def test_sliding_windows_are_written() -> None:
    """Megatron-LM's --window-size (left, right) and --window-attn-skip-freq N (one full-attention
    layer after N - 1 windowed ones), and Megatron Bridge's model fields of the same names."""
    from trainplan.export import megatron as mg
    from trainplan.export import nemo
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.recipe import Recipe

    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    recipe, layout = Recipe(seq_len=8192, global_batch=64), Layout(dp=8, zero=1)
    argv = mg.build_argv(system, load_model("mistral-7b"), recipe, layout)[0]
    i = argv.index("--window-size")
    assert argv[i + 1] == "(4095,0)" and "--window-attn-skip-freq" not in argv
    assert "--window-size" not in mg.build_argv(system, load_model("mistral-7b-v0.2"), recipe, layout)[0]
    text = nemo.render(system, load_model("mistral-7b"), recipe, layout)[0]
    assert '"window_size": (4095, 0),' in text


@pytest.mark.parametrize("target", TARGETS)
def test_attention_sinks_are_written_only_around_the_users_model(target: str) -> None:
    """gpt-oss's sink logits are no option of the targets that build their own model: those refuse,
    naming the targets that wrap the Hugging Face model (which has them)."""
    from trainplan.export import HF_MODEL_TARGETS

    system, model, recipe, layout = _plan("gpt-oss-20b", 8, {"global_batch": 64}, zero=3)
    if target in HF_MODEL_TARGETS:
        assert export_plan(target, system, model, recipe, layout).text
        return
    with pytest.raises(TrainplanError) as err:
        export_plan(target, system, model, recipe, layout)
    assert "attention sinks" in str(err.value) and all(t in str(err.value) for t in HF_MODEL_TARGETS)
