"""Exact verification: reference PyTorch models traced under fake tensors (needs the torch extra).

``trainplan`` itself never imports this package; import it explicitly::

    from trainplan.trace.verify import run_verify

Modules: :mod:`~trainplan.trace.models` (reference Llama/GPT/MoE models),
:mod:`~trainplan.trace.lora` (LoRA/QLoRA adapters), :mod:`~trainplan.trace.tracer` (live-storage
tracer, FLOP formulas), :mod:`~trainplan.trace.step` (layouts on a fake process group and the
traced step), :mod:`~trainplan.trace.verify` (analytic vs traced), :mod:`~trainplan.trace.matrix`
(the configuration matrix).
"""
