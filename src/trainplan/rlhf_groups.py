"""Disaggregated RLHF placement: a device group per model and one for the rollout engine.

OpenRLHF's Ray trainer (Hu et al. 2024, arXiv:2405.11143, Sec. 3.1; ``openrlhf/cli/train_ppo_ray.py``
``--ref_num_gpus_per_node``, ``--reward_num_gpus_per_node``, ``--actor_num_gpus_per_node``,
``--critic_num_gpus_per_node``, ``--vllm_num_engines`` × ``--vllm_tensor_parallel_size``), NeMo RL's
non-colocated generation and verl's split resource pools give each model its own devices, each in
its own layout. ``--groups`` names them: ``actor=4,critic=4,ref=2,reward=2,rollout=4``; ``+`` puts
models on one group (OpenRLHF ``--colocate_actor_ref``, ``--colocate_critic_reward``:
``actor+ref=4``); ``:tpN``, ``:ppN``, ``:zeroN`` give a trained or frozen group its own layout
(default: the job's ``--tp``, ``--pp``, ``--zero``). The rollout group's engines are
``devices / --rollout-tp``. Without a ``rollout`` group the actor's group generates
(``--rollout-engine trainer``: OpenRLHF Ray without vLLM).

The schedule, as OpenRLHF's Ray trainer runs it (synchronous PPO): the step is a **sum of
phases**, each phase the **longest of the groups that run concurrently** in it —

* rollout: the engines generate every sequence (``RemoteExperienceMaker.make_experience``:
  ``llm.generate.remote`` on each engine);
* scoring: the reference, reward and critic forwards are launched together
  (``initial_model.forward.remote``, ``reward_model.forward.remote``, ``critic.forward.remote``)
  while the actor computes the old-policy log-probs, then awaited (``ray.get``): the longest group;
* training: ``critic.fit.remote()`` runs while the actor trains and broadcasts its weights to the
  engines (``ActorPPOTrainer.ppo_train``: critic fit, actor ``ppo_train``, ``_broadcast_to_vllm``,
  then ``ray.get`` of the critic): the critic adds only what exceeds the actor's update + sync;
* sync: ``_broadcast_to_vllm`` gathers each ZeRO-3 parameter over the actor group
  (``deepspeed.zero.GatheredParameters``) and broadcasts it from actor rank 0 to every engine rank
  over one NCCL group (``openrlhf/trainer/ray/ppo_actor.py``, OpenRLHF v0.2).

Memory: every model stays resident on its own group (no phase offload), so a device holds its
group's models and the largest transient of its phases; the job fits when every group fits.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Final

from trainplan.errors import RecipeError
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec

ROLES: Final = ("actor", "critic", "ref", "reward", "rollout")
"""The models a group can hold: the trained actor and critic, the frozen reference and reward
model, and the rollout engine."""

DEDICATED_ENGINE_MEM_FRACTION: Final = 0.9
"""The rollout engine's memory fraction on devices of its own: vLLM's default
``gpu_memory_utilization`` (``vllm/config.py`` ``CacheConfig``; OpenRLHF's 70B script leaves it
unset)."""

_PART = re.compile(r"^(?P<roles>[a-z+]+)=(?P<devices>\d+)(?P<opts>(:[a-z]+\d+)*)$")


@dataclass(frozen=True, kw_only=True)
class DeviceGroup:
    """One device group: the models it holds, its device count and, when given, its own layout
    (``None``: the job's ``--tp`` / ``--pp`` / ``--zero``)."""

    roles: tuple[str, ...]
    devices: int
    tp: int | None = None
    pp: int | None = None
    zero: int | None = None

    @property
    def label(self) -> str:
        return "+".join(self.roles)

    def describe(self) -> str:
        opts = "".join(f":{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("zero", self.zero)) if v)
        return f"{self.label}={self.devices}{opts}"


def parse_groups(text: str) -> tuple[DeviceGroup, ...]:
    """``actor=4,critic=4,ref=2,reward=2,rollout=4`` (``+`` joins models on one group, ``:tp2`` /
    ``:pp2`` / ``:zero3`` set a group's layout) → the groups, every role at most once."""
    out: list[DeviceGroup] = []
    seen: set[str] = set()
    for raw in text.split(","):
        part = raw.strip().lower()
        m = _PART.match(part)
        if m is None:
            raise RecipeError(
                "groups",
                f"cannot read {raw.strip()!r}; write role=devices[:tpN][:ppN][:zeroN], roles joined by '+', "
                f"e.g. actor=4,critic=4,ref+reward=2,rollout=2 (roles: {', '.join(ROLES)})",
            )
        roles = tuple(m["roles"].split("+"))
        for r in roles:
            if r not in ROLES:
                raise RecipeError("groups", f"unknown role {r!r} in {part!r}; roles: {', '.join(ROLES)}")
            if r in seen:
                raise RecipeError("groups", f"{r} is in two groups; give each model one group")
            seen.add(r)
        opts: dict[str, int] = {}
        for opt in filter(None, m["opts"].split(":")):
            key = opt.rstrip("0123456789")
            if key not in ("tp", "pp", "zero") or key in opts:
                raise RecipeError(
                    "groups", f"unknown or repeated layout option {opt!r} in {part!r}: use tp, pp, zero"
                )
            opts[key] = int(opt[len(key) :])
        devices = int(m["devices"])
        if devices <= 0:
            raise RecipeError("groups", f"{part!r}: a group needs at least one device")
        out.append(DeviceGroup(roles=roles, devices=devices, **opts))
    return tuple(out)


def check_groups(
    groups: tuple[DeviceGroup, ...], *, method: str, roles_needed: tuple[str, ...], rollout_engine: str
) -> None:
    """The groups hold exactly the job's models (``roles_needed``; ``rollout`` optional), the
    actor and critic on different groups (they train concurrently), the engine on its own."""
    have = [r for g in groups for r in g.roles]
    missing = [r for r in roles_needed if r not in have]
    if missing:
        raise RecipeError(
            "groups", f"{method} needs a group for {', '.join(missing)}; add e.g. {missing[0]}=2 to --groups"
        )
    extra = [r for r in have if r not in (*roles_needed, "rollout")]
    if extra:
        raise RecipeError("groups", f"{method} has no {', '.join(extra)} model here; drop it from --groups")
    for g in groups:
        if "actor" in g.roles and "critic" in g.roles:
            raise RecipeError(
                "groups",
                "actor and critic train concurrently on their own groups; give them separate groups, "
                "or use --placement colocated for one device set",
            )
        if "rollout" in g.roles and len(g.roles) > 1:
            raise RecipeError(
                "groups",
                "the rollout engine takes its group's memory fraction for weights and KV cache; give it its own "
                "group (rollout=N), or drop it to generate on the actor's group (--rollout-engine trainer)",
            )
        if "rollout" in g.roles and (g.tp or g.pp or g.zero is not None):
            raise RecipeError("groups", "the rollout group's layout is its engines' TP: use --rollout-tp")
    has_rollout = "rollout" in have
    if has_rollout and rollout_engine != "vllm":
        raise RecipeError(
            "rollout_engine",
            f"a rollout group runs an inference engine with its own weights (vllm); {rollout_engine} generates "
            "on the trainer's devices: drop the rollout group or use --rollout-engine vllm",
        )
    if not has_rollout and rollout_engine != "trainer":
        raise RecipeError(
            "groups",
            "no rollout group: the actor's group generates with the training module (--rollout-engine trainer); "
            "add rollout=N for vLLM engines on their own devices",
        )


def group_of(groups: tuple[DeviceGroup, ...], role: str) -> DeviceGroup | None:
    return next((g for g in groups if role in g.roles), None)


def group_system(system: System, group: DeviceGroup) -> System:
    """The job's system cut to the group's devices (same accelerator, node and host)."""
    return dataclasses.replace(system, num_devices=group.devices)


def group_layout(layout: Layout, group: DeviceGroup) -> Layout:
    """The group's layout: its own tp / pp / ZeRO when given, else the job's, data parallel over
    the rest of its devices (``Layout.for_devices``). Frozen groups shard their weights when ZeRO-3
    (OpenRLHF ``DeepspeedStrategy._ds_init_eval_model``: the eval config keeps stage 3, else 0)."""
    tp = group.tp or layout.tp
    pp = group.pp or layout.pp
    return dataclasses.replace(
        Layout.for_devices(
            group.devices, tp=tp, pp=pp, cp=layout.cp, zero=layout.zero if group.zero is None else group.zero
        ),
        sequence_parallel=layout.sequence_parallel and tp > 1,
        pp_schedule=layout.pp_schedule if pp > 1 else "1f1b",
        virtual_stages=layout.virtual_stages if pp > 1 else 1,
        overlap_grad_reduce=layout.overlap_grad_reduce,
        zero3_granularity=layout.zero3_granularity
        if (layout.zero if group.zero is None else group.zero) == 3
        else "block",
        grad_accumulation=layout.grad_accumulation,
    )


def check_devices(groups: tuple[DeviceGroup, ...], system: System) -> None:
    total = sum(g.devices for g in groups)
    if total != system.num_devices:
        raise RecipeError(
            "groups",
            f"the groups hold {total} devices ({', '.join(g.describe() for g in groups)}) but the job has "
            f"{system.num_devices}; give --devices {total} or resize the groups",
        )


def actor_placement(
    system: System, layout: Layout, groups: tuple[DeviceGroup, ...], policy: ModelSpec
) -> tuple[System, Layout]:
    """The actor's own system and layout (its group), checked against the policy."""
    check_devices(groups, system)
    g = group_of(groups, "actor")
    if g is None:
        raise RecipeError("groups", "no actor group; add actor=N to --groups")
    lay = group_layout(layout, g)
    lay.check_model(policy)
    return group_system(system, g), lay


__all__ = [
    "DEDICATED_ENGINE_MEM_FRACTION",
    "ROLES",
    "DeviceGroup",
    "actor_placement",
    "check_devices",
    "check_groups",
    "group_layout",
    "group_of",
    "group_system",
    "parse_groups",
]
