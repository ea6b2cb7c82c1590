"""The parallel layout: how devices split the work, validated as one object.

Degrees (torchtitan's ``ParallelDims`` and Megatron-LM's ``parallel_state`` use the same)::

    devices = dp · cp · tp · pp          (ep is carved out of dp · cp, as in Megatron-LM and torchtitan)

    dp  data parallel (replicas; with zero >= 1 the model states are sharded over dp·cp ranks)
    tp  tensor parallel (Megatron column/row split of every linear; sequence_parallel shards norms/dropout)
    pp  pipeline stages (schedule 1f1b, interleaved with virtual_stages, or zero-bubble "zb")
    cp  context parallel (sequence split across ranks; ring attention)
    ep  expert parallel (experts split across ranks of the dp·cp group)

``overlap_grad_reduce``: gradients are reduced in buckets while the backward runs (PyTorch DDP,
Li et al. 2020 Sec. 3.2.3; Megatron-Core ``overlap_grad_reduce``); False = after the backward of
the last micro-batch, as Megatron-LM's 2021 ``LocalDDP`` did (``megatron/model/distributed.py``).

``tp_comm_overlap``: the sequence-parallel all-gathers and reduce-scatters run beside the linear
layers' GEMMs instead of before / after them (Megatron-Core ``--tp-comm-overlap`` with Transformer
Engine userbuffers; torchtitan's async tensor parallelism). Needs ``sequence_parallel``: the
overlapped collectives are the sequence-parallel ones (Megatron Bridge turns the option off
without sequence parallelism, ``bridge/training/comm_overlap.py``).

``pp_split_embedding`` / ``pp_split_head``: the input embedding (the final norm, LM head and loss)
takes the place of one transformer layer in the pipeline split, so the first chunk of the first
stage (the last chunk of the last stage) holds one layer fewer — Megatron-Core
``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
(megatron/core/transformer/transformer_block.py ``get_num_layers_to_build``), the layout of
Llama 3 405B: 126 layers on 16 stages with 8 virtual stages, the first and last stage one layer
fewer, the first chunk only the embedding and the last only the output layer and loss (Llama 3
paper, Sec. 3.3.2). See :func:`stage_layers`.

``pp_comm_overlap``: pipeline sends and receives run beside the compute of other micro-batches
(Megatron-Core ``overlap_p2p_comm``, which Megatron Bridge enables for interleaved schedules) instead
of blocking the stage.

ZeRO stages (Rajbhandari et al. 2020, Sec. 5): 0 = DDP, 1 = optimizer states sharded,
2 = + gradients sharded, 3 = + parameters sharded (= FSDP FULL_SHARD / FSDP2 ``fully_shard``).
Errors show the arithmetic, e.g. ``tp=3 does not divide 32 attention heads``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from trainplan.errors import LayoutError
from trainplan.limits import MAX_DEVICES, MAX_LAYERS, check_int
from trainplan.models.spec import ModelSpec

ZeroStage = Literal[0, 1, 2, 3]
ZERO_STAGES: Final = get_args(ZeroStage)
PipelineSchedule = Literal["1f1b", "interleaved", "zb"]
PIPELINE_SCHEDULES: Final = get_args(PipelineSchedule)
# How a ZeRO-3 / FSDP implementation groups its parameter gathers and gradient reductions:
# "block": one all-gather / reduce-scatter per transformer block (plus one for the root's
# embeddings and head), prefetched behind compute — PyTorch FSDP/FSDP2 wrapping each block
# (torchtitan ``apply_fsdp``), Megatron-FSDP, DeepSpeed >= 0.6 bucketed gathers.
# "parameter": one list-based collective per parameter tensor, each gather waited on before the
# module runs — DeepSpeed ZeRO-3 as released in 2021 (``stage3.py`` ``fetch_sub_module``).
Zero3Granularity = Literal["block", "parameter"]
ZERO3_GRANULARITIES: Final = get_args(Zero3Granularity)
# How gradients of the step's micro-batches are summed (``timing.grad_accumulation_bytes``):
# "fused": inside the weight-gradient GEMM (Megatron-LM ``--gradient-accumulation-fusion``, cuBLAS
# beta = 1 into the FP32 main gradient; FSDP/ZeRO-2/3 reduce-scatter each micro-batch and add only
# their shard), no separate pass; "autograd": PyTorch's AccumulateGrad adds each later
# micro-batch's gradient into ``.grad`` (DDP with ``no_sync``; Megatron-LM 2021's LocalDDP without
# contiguous buffers); "main_grad": a backward hook adds ``.grad`` into a contiguous main-gradient
# buffer after every micro-batch (Megatron-LM LocalDDP with contiguous buffers, 2021-2022).
GradAccumulation = Literal["fused", "autograd", "main_grad"]
GRAD_ACCUMULATIONS: Final = get_args(GradAccumulation)


@dataclass(frozen=True, kw_only=True)
class LayoutOptions:
    """The engine options of a layout that the planner does not search: it applies the user's
    choice (or the default, and says so) to every candidate where the option means something.

    ``tp_comm_overlap`` applies to the candidates with sequence parallelism, ``pp_comm_overlap``
    to those with a pipeline, ``zero3_granularity`` to those with ZeRO-3, ``ep_comm_overlap`` to
    those with expert parallelism, no pipeline or an interleaved one, and no full recompute
    (:meth:`for_candidate`); the others to all."""

    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False
    pp_comm_overlap: bool = False
    ep_comm_overlap: bool = False
    zero3_granularity: Zero3Granularity = "block"
    grad_accumulation: GradAccumulation = "fused"
    pp_comm_overlap_schedules: tuple[PipelineSchedule, ...] = PIPELINE_SCHEDULES
    """The pipeline schedules on which ``pp_comm_overlap`` applies: all of them, or, as an
    engine rule, only ``("interleaved",)`` (Megatron-LM ``megatron/training/arguments.py`` sets
    ``overlap_p2p_comm`` False without the interleaved schedule; ``trainplan.engines``)."""

    def __post_init__(self) -> None:
        # The same checks as a Layout's, on a layout where every option applies.
        Layout(
            dp=2,
            tp=2,
            pp=2,
            ep=2,
            zero=3,
            sequence_parallel=True,
            pp_schedule="interleaved",
            virtual_stages=2,
            overlap_grad_reduce=self.overlap_grad_reduce,
            tp_comm_overlap=self.tp_comm_overlap,
            pp_comm_overlap=self.pp_comm_overlap,
            ep_comm_overlap=self.ep_comm_overlap,
            zero3_granularity=self.zero3_granularity,
            grad_accumulation=self.grad_accumulation,
        )

    def for_candidate(
        self,
        *,
        sequence_parallel: bool,
        pp: int,
        zero: int,
        pp_schedule: str = "1f1b",
        ep: int = 1,
        recompute: str = "none",
    ) -> dict[str, object]:
        """The Layout keyword arguments of these options on one candidate."""
        return {
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "tp_comm_overlap": self.tp_comm_overlap and sequence_parallel,
            "pp_comm_overlap": self.pp_comm_overlap
            and pp > 1
            and pp_schedule in self.pp_comm_overlap_schedules,
            "ep_comm_overlap": self.ep_comm_overlap and ep_overlap_applies(ep, pp, pp_schedule, recompute),
            "zero3_granularity": self.zero3_granularity if zero == 3 else "block",
            "grad_accumulation": self.grad_accumulation,
        }

    def describe(self) -> str:
        """One line of what differs from the defaults, or 'defaults'."""
        diff = [
            f"{f}={getattr(self, f)}"
            for f in (
                "overlap_grad_reduce",
                "tp_comm_overlap",
                "pp_comm_overlap",
                "ep_comm_overlap",
                "zero3_granularity",
                "grad_accumulation",
            )
            if getattr(self, f) != getattr(DEFAULT_LAYOUT_OPTIONS, f)
        ]
        if self.pp_comm_overlap and self.pp_comm_overlap_schedules != PIPELINE_SCHEDULES:
            diff.remove("pp_comm_overlap=True")
            diff.append("pp_comm_overlap on " + "/".join(self.pp_comm_overlap_schedules) + " schedules")
        return ", ".join(diff) if diff else "defaults"

    @classmethod
    def of_layout(cls, layout: Layout) -> LayoutOptions:
        """The options of an existing layout."""
        return cls(
            overlap_grad_reduce=layout.overlap_grad_reduce,
            tp_comm_overlap=layout.tp_comm_overlap,
            pp_comm_overlap=layout.pp_comm_overlap,
            ep_comm_overlap=layout.ep_comm_overlap,
            zero3_granularity=layout.zero3_granularity,
            grad_accumulation=layout.grad_accumulation,
        )


def ep_overlap_applies(ep: int, pp: int, pp_schedule: str, recompute: str) -> bool:
    """Where Megatron-Core accepts ``overlap_moe_expert_parallel_comm`` (transformer_config.py at
    core_r0.14.0 L1298-1337): expert parallelism, no pipeline or an interleaved one (virtual
    stages required with pp > 1), and no full recompute."""
    return ep > 1 and (pp == 1 or pp_schedule == "interleaved") and recompute != "full"


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    pp_schedule: PipelineSchedule = "1f1b"
    virtual_stages: int = 1
    overlap_grad_reduce: bool = True  # bucketed gradient reduction overlapped with backward
    tp_comm_overlap: bool = False  # sequence-parallel collectives overlapped with the linear GEMMs
    pp_comm_overlap: bool = False  # pipeline sends overlapped with other micro-batches' compute
    ep_comm_overlap: bool = False
    """Expert all-to-alls of one micro-batch overlapped with another micro-batch's compute:
    Megatron-Core ``overlap_moe_expert_parallel_comm`` (with ``delay_wgrad_compute``), the combined
    1F1B schedules of megatron/core/pipeline_parallel/combined_1f1b.py, which run one micro-batch's
    forward beside another's backward (:func:`trainplan.timing.exposed_ep_s`)."""
    zero3_granularity: Zero3Granularity = "block"  # see ZERO3_GRANULARITIES
    grad_accumulation: GradAccumulation = "fused"  # see GRAD_ACCUMULATIONS
    pp_split_embedding: bool = False  # the embedding takes one layer's place in the pipeline split
    pp_split_head: bool = False  # the LM head and loss take one layer's place in the pipeline split
    etp: int | None = None
    """Expert tensor parallelism: each routed expert's linears split over ``etp`` ranks. None is
    ``tp`` (Megatron-Core's default ``expert_tensor_parallel_size``); 1 with ``tp > 1`` is its
    parallel folding (MoE Parallel Folding, Liu et al. 2025, arXiv:2504.14960; Megatron-Core
    ``parallel_state.initialize_model_parallel``): the expert-parallel group is carved from the
    tp·cp·dp ranks of a pipeline stage, so ``ep·etp`` divides ``tp·cp·dp`` and whole experts sit
    on each rank, fed by the all-to-all without a tensor-parallel gather (:attr:`expert_tp`)."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep"):
            check_int(name, getattr(self, name), high=MAX_DEVICES, error=LayoutError, what="devices")
        check_int("virtual_stages", self.virtual_stages, high=MAX_LAYERS, error=LayoutError, what="chunks")
        check_int(
            "devices",
            self.dp * self.tp * self.pp * self.cp,
            high=MAX_DEVICES,
            error=LayoutError,
            what="devices",
        )
        for name in (
            "sequence_parallel",
            "overlap_grad_reduce",
            "tp_comm_overlap",
            "pp_comm_overlap",
            "ep_comm_overlap",
        ):
            if not isinstance(getattr(self, name), bool):
                raise LayoutError(name, f"must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in ZERO_STAGES:
            raise LayoutError(
                "zero", f"ZeRO stage must be 0, 1, 2 or 3 (FSDP full shard = 3), got {self.zero!r}"
            )
        if self.pp_schedule not in PIPELINE_SCHEDULES:
            raise LayoutError(
                "pp_schedule",
                f"unknown schedule {self.pp_schedule!r}; choose {', '.join(PIPELINE_SCHEDULES)}",
            )
        if self.sequence_parallel and self.tp == 1:
            raise LayoutError(
                "sequence_parallel", "sequence parallelism needs tp > 1 (it shards along the tp group)"
            )
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise LayoutError(
                "tp_comm_overlap",
                "tensor-parallel communication overlap needs sequence parallelism (it overlaps the "
                "sequence-parallel all-gather / reduce-scatter with the GEMMs); add --sequence-parallel",
            )
        if self.zero3_granularity not in ZERO3_GRANULARITIES:
            raise LayoutError(
                "zero3_granularity",
                f"unknown granularity {self.zero3_granularity!r}; choose {', '.join(ZERO3_GRANULARITIES)}",
            )
        if self.grad_accumulation not in GRAD_ACCUMULATIONS:
            raise LayoutError(
                "grad_accumulation",
                f"unknown gradient accumulation {self.grad_accumulation!r}; choose {', '.join(GRAD_ACCUMULATIONS)}",
            )
        if self.zero3_granularity != "block" and self.zero != 3:
            raise LayoutError(
                "zero3_granularity",
                f"per-{self.zero3_granularity} gathers describe a ZeRO-3 / FSDP implementation; "
                f"add --zero 3 (got zero={self.zero})",
            )
        for name in ("pp_split_embedding", "pp_split_head"):
            if getattr(self, name) and self.pp == 1:
                raise LayoutError(
                    name,
                    f"{name.replace('_', '-')} places the {'embedding' if 'embedding' in name else 'LM head'} "
                    "in the pipeline split, which needs pp > 1; add --pp N or drop the flag",
                )
        if self.pp_comm_overlap and self.pp == 1:
            raise LayoutError("pp_comm_overlap", "pipeline communication overlap needs pp > 1")
        if self.ep_comm_overlap and not ep_overlap_applies(self.ep, self.pp, self.pp_schedule, "none"):
            raise LayoutError(
                "ep_comm_overlap",
                "expert all-to-all overlap needs expert parallelism (--ep N) and, with a pipeline, the "
                "interleaved schedule (Megatron-Core requires virtual stages); drop --ep-comm-overlap or "
                "add --ep / --pp-schedule interleaved",
            )
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved":
            raise LayoutError(
                "virtual_stages", f"virtual_stages={self.virtual_stages} needs --pp-schedule interleaved"
            )
        if self.pp_schedule != "1f1b" and self.pp == 1:
            raise LayoutError(
                "pp_schedule",
                f"a {self.pp_schedule} pipeline schedule needs pp > 1 (without a pipeline there is no "
                "schedule to choose); add --pp N or drop --pp-schedule",
            )
        if self.pp_schedule == "interleaved" and self.virtual_stages < 2:
            raise LayoutError(
                "virtual_stages",
                "an interleaved schedule runs v >= 2 model chunks per stage; add --virtual-stages 2 "
                "(or more), or use --pp-schedule 1f1b",
            )
        if self.etp is not None:
            check_int("etp", self.etp, high=MAX_DEVICES, error=LayoutError, what="devices")
            if self.etp not in (1, self.tp):
                raise LayoutError(
                    "etp",
                    f"etp={self.etp}: expert tensor parallelism is modelled as tp (the default, {self.tp}) "
                    "or 1 (parallel folding: whole experts per rank); use --etp 1 or drop --etp",
                )
            if self.etp == 1 and self.tp > 1 and not self.sequence_parallel:
                raise LayoutError(
                    "etp",
                    "--etp 1 with tp > 1 feeds the experts from the sequence-parallel shard of each tp "
                    "rank (Megatron-Core requires sequence parallelism with MoE and tensor parallelism); "
                    "add --sequence-parallel",
                )
        if self.expert_tp == self.tp:
            if (self.dp * self.cp) % self.ep != 0:
                folds = self.tp > 1 and (self.tp * self.cp * self.dp) % self.ep == 0
                raise LayoutError(
                    "ep",
                    f"ep={self.ep} does not divide dp·cp = {self.dp}·{self.cp} = {self.dp * self.cp}"
                    + (
                        f"; it divides tp·cp·dp = {self.tp * self.cp * self.dp}: fold the experts into the "
                        "tp ranks with --etp 1 (whole experts per rank, with --sequence-parallel)"
                        if folds
                        else ""
                    ),
                )
        elif (self.tp * self.cp * self.dp) % self.ep != 0:
            raise LayoutError(
                "ep",
                f"ep={self.ep} with --etp 1 does not divide tp·cp·dp = {self.tp}·{self.cp}·{self.dp} = "
                f"{self.tp * self.cp * self.dp} (the ranks of a pipeline stage the expert groups fold into)",
            )

    @classmethod
    def for_devices(
        cls,
        devices: int,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        zero: int = 0,
        sequence_parallel: bool = False,
        pp_schedule: PipelineSchedule = "1f1b",
        virtual_stages: int = 1,
        overlap_grad_reduce: bool = True,
        tp_comm_overlap: bool = False,
        pp_comm_overlap: bool = False,
        zero3_granularity: Zero3Granularity = "block",
        grad_accumulation: GradAccumulation = "fused",
        pp_split_embedding: bool = False,
        pp_split_head: bool = False,
        ep_comm_overlap: bool = False,
        etp: int | None = None,
    ) -> Layout:
        """dp = devices / (tp·pp·cp), with an error that shows the arithmetic when it does not divide."""
        check_int("devices", devices, high=MAX_DEVICES, error=LayoutError, what="devices")
        for name, v in (("tp", tp), ("pp", pp), ("cp", cp)):
            check_int(name, v, high=MAX_DEVICES, error=LayoutError, what="devices")
        model_parallel = tp * pp * cp
        if devices % model_parallel != 0:
            raise LayoutError(
                "devices",
                f"tp·pp·cp = {tp}·{pp}·{cp} = {model_parallel} does not divide {devices} devices; "
                f"use a device count that is a multiple of {model_parallel}",
            )
        return cls(
            dp=devices // model_parallel,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            zero=zero,
            sequence_parallel=sequence_parallel,
            pp_schedule=pp_schedule,
            virtual_stages=virtual_stages,
            overlap_grad_reduce=overlap_grad_reduce,
            tp_comm_overlap=tp_comm_overlap,
            pp_comm_overlap=pp_comm_overlap,
            zero3_granularity=zero3_granularity,
            grad_accumulation=grad_accumulation,
            pp_split_embedding=pp_split_embedding,
            pp_split_head=pp_split_head,
            ep_comm_overlap=ep_comm_overlap,
            etp=etp,
        )

    @property
    def num_devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Ranks each routed expert's linears are split over: ``etp``, or ``tp`` when not given."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Ranks that hold the same experts and reduce their gradients (the expert ZeRO group):
        ``tp·cp·dp / (ep·etp)``, which is ``dp·cp / ep`` when etp = tp."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def shard_group(self) -> int:
        """Ranks over which ZeRO/FSDP shards model states: dp·cp (Megatron distributed optimizer, FSDP2)."""
        return self.dp * self.cp

    def check_model(self, model: ModelSpec) -> None:
        """Raise :class:`LayoutError` if the layout cannot split this model."""
        if model.num_heads % self.tp != 0:
            raise LayoutError("tp", f"tp={self.tp} does not divide {model.num_heads} attention heads")
        if model.num_kv_heads % self.tp != 0 and self.tp % model.num_kv_heads != 0:
            raise LayoutError(
                "tp",
                f"tp={self.tp} neither divides nor is a multiple of {model.num_kv_heads} key/value heads",
            )
        if self.pp > model.num_layers:
            raise LayoutError("pp", f"pp={self.pp} exceeds the model's {model.num_layers} layers")
        self.stage_layers(model.num_layers)  # raises when the chunks outnumber the layers
        if self.ep > 1:
            if model.moe is None:
                raise LayoutError(
                    "ep", f"ep={self.ep} needs a mixture-of-experts model; {model.name} is dense"
                )
            if model.moe.num_experts % self.ep != 0:
                raise LayoutError("ep", f"ep={self.ep} does not divide {model.moe.num_experts} experts")
        if self.etp is not None and model.moe is None:
            raise LayoutError("etp", f"--etp splits routed experts; {model.name} is dense: drop --etp")
        ffn = model.ffn_hidden
        if ffn and ffn % self.tp != 0:
            raise LayoutError("tp", f"tp={self.tp} does not divide the MLP width {ffn}")
        if model.moe is not None and model.moe.expert_ffn_hidden % self.expert_tp != 0:
            raise LayoutError(
                "tp",
                f"the expert tensor-parallel degree {self.expert_tp} does not divide the expert MLP "
                f"width {model.moe.expert_ffn_hidden}",
            )

    def check_batch(self, *, seq_len: int, micro_batch: int, global_batch: int | None) -> int:
        """Validate batch arithmetic; return micro-batches per step per pipeline (gradient accumulation)."""
        if self.cp > 1 and seq_len % (2 * self.cp) != 0:
            # Causal load balancing splits the sequence into 2·cp chunks, rank r holding chunks r
            # and 2·cp − 1 − r (Megatron-Core ``get_batch_on_this_cp_rank``, megatron/core/utils.py;
            # torchtitan's context parallel uses the same round-robin split).
            raise LayoutError(
                "cp",
                f"context parallelism splits the sequence into 2·cp = {2 * self.cp} load-balanced chunks, "
                f"which do not divide {seq_len} tokens; use a sequence length that is a multiple of "
                f"{2 * self.cp} or a smaller cp",
            )
        if self.sequence_parallel and (seq_len // self.cp) % self.tp != 0:
            raise LayoutError(
                "sequence_parallel",
                f"tp={self.tp} does not divide the per-rank sequence {seq_len // self.cp}",
            )
        if global_batch is None:
            return 1
        per_step = self.dp * micro_batch
        if global_batch % per_step != 0:
            raise LayoutError(
                "global_batch",
                f"global batch {global_batch} is not a multiple of dp·micro_batch = {self.dp}·{micro_batch} = "
                f"{per_step}",
            )
        return global_batch // per_step

    def stage_layers(self, num_layers: int) -> tuple[tuple[int, ...], ...]:
        """The transformer layers of each pipeline stage (:func:`stage_layers`)."""
        return stage_layers(
            num_layers, self.pp, self.virtual_stages, self.pp_split_embedding, self.pp_split_head
        )

    def describe(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}" + ("+a2a-overlap" if self.ep_comm_overlap else ""))
        if self.expert_tp != self.tp:
            parts.append(f"etp={self.expert_tp}")
        parts.append(f"zero={self.zero}")
        if self.zero3_granularity != "block":
            parts.append(f"per-{self.zero3_granularity} gathers")
        if self.grad_accumulation != "fused":
            parts.append(f"grad-accumulation={self.grad_accumulation}")
        if self.sequence_parallel:
            parts.append("sp+overlap" if self.tp_comm_overlap else "sp")
        if self.pp > 1:
            parts.append(self.pp_schedule + (f"(v={self.virtual_stages})" if self.virtual_stages > 1 else ""))
            if self.pp_comm_overlap:
                parts.append("p2p-overlap")
            if self.pp_split_embedding:
                parts.append("embedding-in-split")
            if self.pp_split_head:
                parts.append("head-in-split")
        return " ".join(parts)


@functools.lru_cache(maxsize=1024)
def stage_layers(
    num_layers: int,
    pp: int,
    virtual_stages: int = 1,
    split_embedding: bool = False,
    split_head: bool = False,
) -> tuple[tuple[int, ...], ...]:
    """Transformer layers of each pipeline stage — the one assignment that memory, FLOPs, timing
    and the planner read.

    The model is cut into ``pp·v`` contiguous chunks; chunk ``c`` runs on stage ``c mod pp``, so
    with interleaving (``virtual_stages`` v > 1) stage ``r`` holds chunks ``r, r+pp, r+2pp, …``
    (Narayanan et al. 2021, Sec. 2.2.2; Megatron-Core ``get_transformer_layer_offset``). The
    units split are the L layers, plus one for the embedding before layer 0 when
    ``split_embedding`` and one for the LM head and loss after the last layer when ``split_head``
    (Megatron-Core ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split``: ``num_layers += 1`` for the split, then the first
    virtual chunk of the first stage / the last virtual chunk of the last stage builds one layer
    fewer, megatron/core/transformer/transformer_block.py ``get_num_layers_to_build``). Each
    chunk takes ``units // (pp·v)`` units and the first ``units mod (pp·v)`` chunks one more
    (Megatron-Core requires an even split; this rule extends it).

    Llama 3 405B (126 layers, pp = 16, v = 8, both flags): 128 units, one per chunk — the first
    chunk holds only the embedding, the last only the head, the first and last stage 7 layers and
    the others 8 (Llama 3 paper, Sec. 3.3.2).
    """
    chunks = pp * virtual_stages
    units = num_layers + int(split_embedding) + int(split_head)
    if chunks > units:
        parts = (
            f"{num_layers} layers"
            + (" + the embedding" if split_embedding else "")
            + (" + the head" if split_head else "")
        )
        raise LayoutError(
            "virtual_stages" if virtual_stages > 1 else "pp",
            f"pp·virtual_stages = {pp}·{virtual_stages} = {chunks} chunks exceed {parts}; use fewer "
            "stages or chunks"
            + (
                ""
                if split_embedding and split_head
                else ", or place the embedding "
                "and the head in the split (--pp-split-embedding, --pp-split-head)"
            ),
        )
    base, extra = divmod(units, chunks)
    sizes = [base + (1 if c < extra else 0) for c in range(chunks)]
    if split_embedding:
        sizes[0] -= 1
    if split_head:
        sizes[-1] -= 1
    stages: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(sizes):
        stages[c % pp].extend(range(start, start + n))
        start += n
    return tuple(tuple(st) for st in stages)


DEFAULT_LAYOUT_OPTIONS: Final = LayoutOptions()


def nearest_micro_batches(global_batch: Any, per_step: Any) -> Any:
    """Micro-batches per step of the valid global batch nearest ``global_batch`` (sequences): the
    multiple of ``per_step`` = dp·micro_batch closest to it (halves round up), at least one —
    what the planner trains with where dp·micro_batch does not divide the requested batch.
    Integer arithmetic, for ints and integer arrays alike (``num.Int``)."""
    from trainplan.num import maximum

    return maximum((global_batch + per_step // 2) // per_step, 1)
