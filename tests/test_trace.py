"""Exact verification: reference models, the live-storage tracer, FLOPs and analytic-vs-traced."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed (pip install torch==2.13.0)")

from trainplan.layout import Layout  # noqa: E402
from trainplan.models import count_params, load_model  # noqa: E402
from trainplan.models.spec import ModelSpec  # noqa: E402
from trainplan.recipe import Recipe  # noqa: E402

pytestmark = pytest.mark.torch


def _llama(**kw: object) -> ModelSpec:
    base: dict[str, object] = dict(
        name="tiny-llama",
        family="llama",
        num_layers=2,
        hidden_size=256,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        ffn_hidden=688,
        vocab_size=1000,
    )
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _gpt(**kw: object) -> ModelSpec:
    base: dict[str, object] = dict(
        name="tiny-gpt",
        family="gpt2",
        num_layers=2,
        hidden_size=192,
        num_heads=6,
        num_kv_heads=6,
        head_dim=32,
        ffn_hidden=768,
        vocab_size=1000,
        activation="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=True,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        max_seq_len=512,
    )
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


# -- reference models ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "gpt2",
        "llama-2-7b",
        "llama-3-8b",
        "llama-3-70b",
        "mixtral-8x7b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
        "gemma-2-9b",
        "olmo-2-7b",
        "phi-3-mini",
        "qwen2.5-7b",
        "pythia-160m",
    ],
)
def test_reference_model_parameter_count_equals_count_params(name: str) -> None:
    from trainplan.trace.models import build_model, num_params

    spec = load_model(name)
    assert num_params(build_model(spec, dtype=torch.float32, device="meta")) == count_params(spec).total


def test_lora_and_qlora_storage_is_what_the_papers_say() -> None:
    """LoRA adds r·(in+out) per targeted linear; NF4 packs 2 weights per byte + per-block constants."""
    from trainplan.recipe import LoRASpec
    from trainplan.trace.lora import NF4Linear, apply_lora, quant_buffers
    from trainplan.trace.models import build_model

    spec = _llama(num_layers=1)
    h, q, kv, f, r = 256, 256, 64, 688, 8
    net = build_model(spec, dtype=torch.bfloat16)
    apply_lora(net, LoRASpec(rank=r, targets=("q", "v")), quantize=False, dtype=torch.bfloat16)
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert trainable == r * (h + q) + r * (h + kv)

    net = build_model(spec, dtype=torch.bfloat16)
    apply_lora(
        net,
        LoRASpec(rank=r, double_quant=True, quant_block=64, double_quant_block=256),
        quantize=True,
        dtype=torch.bfloat16,
    )
    packed, consts = quant_buffers(net)
    n_lin = h * q + 2 * h * kv + q * h + 3 * h * f
    assert sum(t.numel() * t.element_size() for t in packed) == n_lin // 2
    n_blocks = [(o * i + 63) // 64 for (i, o) in [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]]
    expect = sum(nb + 4 * ((nb + 255) // 256) + 4 for nb in n_blocks)  # uint8 absmax + fp32 scale + offset
    assert sum(t.numel() * t.element_size() for t in consts) == expect
    assert sum(isinstance(m, NF4Linear) for m in net.modules()) == 7


# -- the tracer --------------------------------------------------------------------------------
def test_tracer_peak_and_frees_follow_storages() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainplan.trace.tracer import LiveStorageTracker

    with FakeTensorMode():
        tr = LiveStorageTracker()
        with tr:
            a = torch.empty(1000, dtype=torch.float32)  # 4000 B
            b = torch.empty(500, dtype=torch.bfloat16)  # 1000 B
            v = a.view(10, 100)  # a view: no new storage
            del a
            assert tr.total_bytes == 5000
            del v  # last reference to a's storage
            c = torch.empty(2000, dtype=torch.uint8)  # 2000 B
            assert tr.total_bytes == 3000
            c.untyped_storage().resize_(0)
            assert tr.total_bytes == 1000
        assert tr.peak_bytes == 5000
        del b


def _bs_llama_layer_saved_bytes(spec: ModelSpec, b: int, s: int, e: int) -> int:
    """Per-layer saved bytes of a Llama block, flash SDPA, no recompute (docs/verify.md):

    norm inputs 2·e·h and rstd 2·4, normed inputs of q/k/v and gate/up 2·e·h, q and k after RoPE,
    v, the attention output (e·(2q + 2kv)), the log-sum-exp 4·a, and the SwiGLU gate output,
    SiLU output, up output and product 4·e·f — per token.
    """
    h, q, kv, f, a = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    return b * s * (4 * e * h + 2 * e * q + 2 * e * kv + 4 * e * f + 2 * 4 + 4 * a)


def _bs_gpt_layer_saved_bytes(spec: ModelSpec, b: int, s: int, e: int) -> int:
    """GPT block: LayerNorm input + FP32 mean + FP32 rstd (e·h + 2·4) twice, normed inputs
    (2·e·h), q/k/v and output (e·(2q + 2kv)), log-sum-exp 4·a, GeLU input and output (2·e·f).

    The statistics are FP32 as the CUDA ``native_layer_norm`` keeps them (the CPU kernel would
    keep them in the input dtype; the reference LayerNorm saves FP32 copies).
    """
    h, q, kv, f, a = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    return b * s * (4 * e * h + 2 * 2 * 4 + 2 * e * q + 2 * e * kv + 2 * e * f + 4 * a)


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("b,s", [(1, 128), (2, 64)])
def test_saved_bytes_per_layer_match_the_derivation(precision: str, e: int, b: int, s: int) -> None:
    from trainplan.trace.step import trace_step

    recipe = Recipe(seq_len=s, micro_batch=b, precision=precision)  # type: ignore[arg-type]
    llama = _llama()
    tr = trace_step(llama, recipe, Layout())
    # layer 0 also saves the shared RoPE cos/sin tables (2 · s · d · e) and the token ids (8·b·s)
    assert tr.layer_saved_bytes[1] == _bs_llama_layer_saved_bytes(llama, b, s, e)
    gpt = _gpt()
    tr = trace_step(gpt, recipe, Layout())
    assert tr.layer_saved_bytes[1] == _bs_gpt_layer_saved_bytes(gpt, b, s, e)


def test_full_recompute_saves_only_the_block_input() -> None:
    from trainplan.trace.step import trace_step

    spec = _llama(num_layers=3)
    tr = trace_step(spec, Recipe(seq_len=128, micro_batch=2, recompute="full"), Layout())
    assert tr.layer_saved_bytes[1] == 2 * 128 * spec.hidden_size * 2


@pytest.mark.parametrize("precision,e", [("bf16", 2), ("fp32", 4)])
def test_sac_keeps_what_the_per_op_policy_marks(precision: str, e: int) -> None:
    """torchtitan's per-op policy on the reference blocks: a Llama block keeps its input, q, v,
    gate, down (the odd aten.mm calls) and the flash output and log-sum-exp; a GPT-2 block, whose
    linears are aten.addmm, keeps only its input and the flash outputs (memory.sac_layer_terms)."""
    from trainplan.memory import layer_activations
    from trainplan.trace.step import trace_step

    b, s = 2, 64
    recipe = Recipe(seq_len=s, micro_batch=b, precision=precision, recompute="sac")  # type: ignore[arg-type]
    for spec in (_llama(num_layers=3), _gpt(num_layers=3), _llama(num_layers=3, qkv_bias=True)):
        tr = trace_step(spec, recipe, Layout())
        analytic = layer_activations(spec, recipe, Layout(), 1).total_bytes
        assert tr.layer_saved_bytes[1] == analytic, spec.name
    llama = _llama()
    h, q, g, f, a = llama.hidden_size, llama.q_dim, llama.kv_dim, llama.ffn_hidden, llama.num_heads
    assert layer_activations(llama, recipe, Layout(), 1).total_bytes == (
        e * b * s * (2 * h + 2 * q + g + f) + 4 * b * a * s
    )


def test_sac_flops_and_unsupported_layouts() -> None:
    from trainplan.flops import step_flops
    from trainplan.trace.step import UnsupportedConfig, trace_step

    spec = _llama(num_layers=2)
    recipe = Recipe(seq_len=64, micro_batch=2, recompute="sac")
    tr = trace_step(spec, recipe, Layout())
    sf = step_flops(spec, recipe, Layout())
    assert tr.gemm_flops == sf.gemm_flops
    assert tr.attention_flops == sf.attention_flops
    with pytest.raises(UnsupportedConfig, match="tensor parallelism"):
        trace_step(spec, recipe, Layout(tp=2))


def test_fp32_model_states_are_4_4_8_bytes_and_peak_is_in_the_step() -> None:
    from trainplan.trace.step import trace_step

    spec = _llama()
    tr = trace_step(spec, Recipe(seq_len=64, precision="fp32"), Layout())
    n = count_params(spec).total
    assert tr.state_bytes["parameters"] == 4 * n
    assert tr.state_bytes["gradients"] == 4 * n
    # AdamW's `step` counters live on the host (torch/optim/adam.py: device="cpu" unless
    # capturable or fused), so the device holds the two moments only
    assert tr.state_bytes["optimizer"] == 8 * n
    # foreach AdamW: one fp32 temporary of the parameters' size (torch/optim/adam.py _foreach_sqrt)
    # (plus a few 4-byte scalars alive at that moment)
    assert 4 * n <= tr.phase_breakdowns_bytes["optimizer"]["temporaries"] <= 4 * n + 64
    assert tr.peak_phase == "optimizer"


def test_full_recompute_frees_the_checkpoint_graph_after_backward() -> None:
    """Nothing recomputed or saved by checkpointing survives into the optimizer step: only the
    foreach temporaries (the flop counter's module tracker is left out, see tracer._GlobalScope)."""
    from trainplan.trace.step import trace_step

    spec = _llama(num_layers=3)
    tr = trace_step(spec, Recipe(seq_len=128, precision="fp32", recompute="full"), Layout())
    n = count_params(spec).total
    at_step = tr.phase_breakdowns_bytes["optimizer"]
    assert 4 * n <= at_step["temporaries"] <= 4 * n + 64
    assert at_step["activations"] <= 2 * 128 * spec.head_dim * 4 + 8 * 128  # RoPE tables, token ids


def test_tensor_parallel_embedding_gradient_is_replicated() -> None:
    """DTensor's embedding backward has no row-wise strategy: the vocabulary-parallel embedding's
    gradient is a replicated V × h tensor on every rank (memory.tp_embedding_grad_extra_params)."""
    from trainplan.memory import memory_breakdown
    from trainplan.trace.step import trace_step

    spec = _llama()
    recipe, layout = Recipe(seq_len=64, precision="fp32"), Layout(tp=2)
    tr = trace_step(spec, recipe, layout)
    mem = memory_breakdown(spec, recipe, layout, num_microbatches=1)
    v, h = spec.vocab_size, spec.hidden_size
    assert mem.tp_embedding_grad_bytes == 4 * (v * h - v // 2 * h)
    assert (
        tr.state_bytes["gradients"] == mem.gradients_bytes == mem.weights_bytes + mem.tp_embedding_grad_bytes
    )


def test_sequence_parallel_saves_the_gathered_linear_inputs() -> None:
    """With DTensor sequence parallelism the q/k/v and gate/up inputs are saved all-gathered."""
    from trainplan.memory import layer_activations
    from trainplan.trace.step import trace_step

    spec = _llama()
    recipe, layout = Recipe(seq_len=64, micro_batch=2, stack="pytorch"), Layout(tp=2, sequence_parallel=True)
    tr = trace_step(spec, recipe, layout)
    terms = layer_activations(spec, recipe, layout, 1).terms
    assert terms["sp_gathered_inputs"] == 2 * 2 * 2 * 64 * spec.hidden_size / 2
    assert tr.layer_saved_bytes[1] == sum(terms.values())
    # Megatron-Core saves the local shard (Korthikanti et al. 2022 Sec. 4.2.2)
    assert (
        "sp_gathered_inputs"
        not in layer_activations(spec, replace(recipe, stack="megatron"), layout, 1).terms
    )


def test_causal_attention_flops_follow_the_convention() -> None:
    """Forward 2·2·b·s²·(a·d)/2; backward 5/2 of that (torch's five backward matmuls, halved)."""
    from trainplan.trace.step import trace_step

    spec = _llama(num_layers=1)
    b, s = 2, 128
    tr = trace_step(spec, Recipe(seq_len=s, micro_batch=b), Layout())
    fwd = 2 * 2 * b * s * s * spec.q_dim // 2
    assert tr.flops_by_op["_scaled_dot_product_flash_attention_for_cpu"] == fwd
    assert tr.flops_by_op["_scaled_dot_product_flash_attention_for_cpu_backward"] == 5 * fwd // 2


def test_matmul_flops_are_six_per_weight_per_token() -> None:
    """Every linear costs 2·in·out per token forward and twice that backward (no frozen weights)."""
    from trainplan.trace.step import trace_step

    spec = _llama(num_layers=2)
    b, s = 1, 64
    tr = trace_step(spec, Recipe(seq_len=s, micro_batch=b), Layout())
    h, q, kv, f, v = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.ffn_hidden, spec.vocab_size
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * f
    matmul_weights = spec.num_layers * per_layer + h * v  # the embedding is a lookup, not a matmul
    assert tr.gemm_flops == 6 * matmul_weights * b * s


# -- analytic vs traced --------------------------------------------------------------------------
def test_verify_result_renders_and_serialises() -> None:
    from trainplan.trace.verify import run_verify

    res = run_verify(_llama(), Recipe(seq_len=64), Layout(), world_size=1)
    d = res.to_dict()
    assert {r["name"] for r in d["memory"]} >= {"weights", "gradients", "optimizer", "activations", "peak"}
    text = res.render()
    assert "peak" in text and "gemm_flops" in text
    with pytest.raises(ValueError, match="world_size"):
        run_verify(_llama(), Recipe(seq_len=64), Layout(dp=2, zero=3), world_size=1)


def test_unsupported_layouts_say_why() -> None:
    from trainplan.trace.step import UnsupportedConfig, trace_step

    with pytest.raises(UnsupportedConfig, match="pipeline"):
        trace_step(_llama(), Recipe(seq_len=64), Layout(dp=1, pp=2))


@pytest.mark.slow
def test_70b_full_depth_step_traces_within_60_s() -> None:
    from trainplan.trace.step import trace_step

    # CPU time of this process (all its threads): what the trace costs on this machine, not what
    # other processes sharing the two cores take from it (wall time is reported alongside).
    t0, c0 = time.perf_counter(), time.process_time()
    tr = trace_step(load_model("llama-3-70b"), Recipe(seq_len=4096), Layout(dp=64, zero=3))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert cpu <= 60.0, f"70B step traced in {cpu:.1f} s of CPU time ({elapsed:.1f} s wall)"
    n = count_params(load_model("llama-3-70b")).total
    # FSDP2 mixed precision: fp32 shards + fp32 gradient shards + two fp32 moments = 16 bytes / 64
    assert tr.state_bytes["parameters"] + tr.state_bytes["gradients"] + tr.state_bytes[
        "optimizer"
    ] == pytest.approx(16 * n / 64, rel=1e-3)


@pytest.mark.parametrize(
    "name",
    [
        "llama-2-7b",
        "mixtral-8x7b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
        "gemma-2-9b",
        "olmo-2-7b",
        "qwen2.5-7b",
    ],
)
def test_reference_model_parameter_tensors_equal_the_per_parameter_gather_count(name: str) -> None:
    """A per-parameter ZeRO-3 issues one collective per tensor of ``model.parameters()``."""
    from trainplan.models.params import layer_parameter_tensors, root_parameter_tensors
    from trainplan.trace.models import build_model

    spec = load_model(name)
    net = build_model(spec, dtype=torch.float32, device="meta")
    expected = sum(layer_parameter_tensors(spec, i) for i in range(spec.num_layers))
    assert len(list(net.parameters())) == expected + root_parameter_tensors(spec)
