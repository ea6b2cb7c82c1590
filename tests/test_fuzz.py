"""Property-based fuzzing of every entry point: the CLI, the Python API and the web API.

Each answer is either refused with a typed error (exit status 2 and one line; a
:class:`~trainplan.errors.TrainplanError`; an HTTP 4xx JSON error) or it satisfies the
invariants of a prediction:

* every number is finite and non-negative, and the JSON is strict (no NaN or Infinity);
* the device fits ⇔ the per-device total is within capacity (and ``fits`` needs it);
* 0 < MFU <= HFU < 1;
* tokens/s = global batch × sequence length / step time;
* peak memory is monotone in the micro-batch and the sequence length;
* model-state memory is ZeRO-3 <= ZeRO-2 <= ZeRO-1 <= ZeRO-0;
* every optional flag changes the answer or is refused.

The number of examples per test is ``TRAINPLAN_FUZZ_EXAMPLES`` (default 20, what CI runs); a
longer run is ``TRAINPLAN_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py`` (docs/api.md, "Fuzzing").
``TRAINPLAN_FUZZ_SEED`` picks another deterministic sequence of examples.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import trainplan
from trainplan import inputs
from trainplan.cli import main as cli_main
from trainplan.errors import TrainplanError
from trainplan.hardware import list_accelerators
from trainplan.models import preset_names
from trainplan.web import api as web_api
from trainplan.web import make_server
from trainplan.web.server import TrainplanServer

EXAMPLES: Final = int(os.environ.get("TRAINPLAN_FUZZ_EXAMPLES", "20"))
SEED: Final = int(os.environ.get("TRAINPLAN_FUZZ_SEED", "0"))
FUZZ: Final = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
CASES: dict[str, int] = {}
"""Cases run per test, printed at the end of the session (pytest -s shows it)."""


def _count(name: str) -> None:
    CASES[name] = CASES.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_cases() -> Iterator[None]:
    yield
    total = sum(v for k, v in CASES.items() if "answered" not in k)
    print(f"\nfuzz cases run: {total} ({', '.join(f'{k} {v}' for k, v in sorted(CASES.items()))})")


# --- values ---------------------------------------------------------------------------------------
SMALL_MODELS: Final = ("gpt2", "pythia-160m", "llama-3.2-1b", "qwen1.5-moe-a2.7b", "gemma-2-9b", "llama-3-8b")
MODELS: Final = (*preset_names(), "no-such-model", "", " ", "x" * 300, "/no/such/config.json", "..")
HARDWARE: Final = (*(a.name for a in list_accelerators()), "no-such-chip", "", "H100_SXM")
EDGE_INTS: Final = st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 1024, 4096, -1, 2**31, 2**63, 10**30])
EDGE_FLOATS: Final = st.sampled_from(
    [0.0, 5e-324, 1e-9, 0.1, 0.5, 1.0, 1.2, 2.0, 1e9, 1e12, 1e300, -1.0, math.inf, -math.inf, math.nan]
)
JUNK_TEXT: Final = st.sampled_from(["", "x", "1e", "0x10", "-", "--", "nan", "1,2", "q,,k", "é", "9" * 5000])


def _value_text(f: inputs.Field) -> st.SearchStrategy[str]:
    """CLI text for field ``f``: mostly valid, sometimes at or past an edge, sometimes junk."""
    if f.choices is not None:
        return st.one_of(st.sampled_from([str(c) for c in f.choices]), JUNK_TEXT)
    if f.type is int:
        return st.one_of(EDGE_INTS.map(str), st.integers(1, 64).map(str), JUNK_TEXT)
    if f.type is float:
        return st.one_of(EDGE_FLOATS.map(repr), st.floats(0.01, 1e13).map(repr), JUNK_TEXT)
    if f.name == "lora_targets":
        return st.one_of(
            st.lists(st.sampled_from(["q", "k", "v", "o", "gate", "up", "down"]), min_size=1, max_size=4).map(
                ",".join
            ),
            JUNK_TEXT,
        )
    if f.name == "provider":
        return st.sampled_from(["aws", "gcp", "azure", "lambda", "nobody"])
    if f.name == "hardware_file":
        return st.sampled_from(["/nonexistent.toml", "/dev/null", "/", "/dev/zero"])
    return JUNK_TEXT


OPTIONAL_FIELDS: Final = tuple(
    f for f in inputs.ESTIMATE_FIELDS if not f.required and not f.positional and f.name != "hardware_file"
)


@st.composite
def estimate_argv(draw: st.DrawFn) -> list[str]:
    argv = ["estimate", draw(st.sampled_from(MODELS)), "--hardware", draw(st.sampled_from(HARDWARE))]
    chosen = draw(st.lists(st.sampled_from(OPTIONAL_FIELDS), max_size=8, unique_by=lambda f: f.name))
    for f in chosen:
        if f.type is bool:
            argv.append(f.option)
        else:
            argv += [f.option, draw(_value_text(f))]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


# --- invariants -----------------------------------------------------------------------------------
def _strict_json(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"non-finite number {token} in JSON")

    return json.loads(text, parse_constant=refuse)


def _numbers(value: object, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, float(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")


def _signed(path: str) -> bool:
    """The numbers that may be negative: the relative bounds of a calibration band."""
    return ".calibration." in path + "." and path.rsplit(".", 1)[-1] in ("low", "high")


def check_estimate(d: Mapping[str, Any]) -> None:
    """The invariants every estimate answer holds."""
    for path, x in _numbers(d):
        assert math.isfinite(x), f"{path} = {x}"
        assert x >= 0 or _signed(path), f"{path} = {x}"
    mem = d["memory"]
    device_fits = mem.get("device_fits", mem["fits"])
    assert device_fits == (mem["per_device_bytes"] <= mem["capacity_bytes"]), mem
    assert not mem["fits"] or device_fits
    if not mem["fits"]:
        assert d["reasons"]
    thr = d["throughput"]
    assert 0 < thr["mfu"] <= thr["hfu"] < 1, thr
    layout, recipe = d["layout"], d["recipe"]
    batch = recipe["global_batch"] or layout["dp"] * recipe["micro_batch"]
    tokens_per_s = batch * recipe["seq_len"] / d["time"]["step_s"]
    assert math.isclose(thr["tokens_per_s"], tokens_per_s, rel_tol=1e-9), (thr["tokens_per_s"], tokens_per_s)
    assert d["time"]["step_s"] > 0


def _one_error_line(err: str) -> None:
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("trainplan: error: "), err
    assert "Traceback" not in err


# --- the CLI --------------------------------------------------------------------------------------
def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@seed(SEED)
@FUZZ
@given(argv=estimate_argv())
def test_cli_estimate_answers_or_refuses_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _count("cli estimate")
    code, out, err = _run_cli(argv, capsys)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        _one_error_line(err)
        return
    _count("cli estimate (answered)")
    if "--json" in argv:
        check_estimate(_strict_json(out))
    else:
        assert "Traceback" not in out + err


@seed(SEED)
@settings(FUZZ, max_examples=max(2, EXAMPLES // 5))
@given(
    command=st.sampled_from(["plan", "compare"]),
    model=st.sampled_from(SMALL_MODELS[:3]),
    hardware=st.sampled_from(["h100-sxm", "a100-80gb,mi300x", "tpu-v5p,wse-3", "h100-sxm,nope"]),
    extra=st.lists(
        st.sampled_from(
            [
                ["--method", "qlora"],
                ["--method", "lora", "--lora-rank", "4096"],
                ["--seq-len", "8192"],
                ["--tokens", "5e-324"],
                ["--tokens", "1e9"],
                ["--max-devices", "8"],
                ["--price", "2"],
                ["--device-price", "h100-sxm=1.5"],
                ["--micro-batch", "2"],
                ["--global-batch", "99999999999"],
                ["--no-double-quant"],
            ]
        ),
        max_size=3,
    ),
)
def test_cli_plan_and_compare_answer_or_refuse(
    command: str, model: str, hardware: str, extra: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _count(f"cli {command}")
    argv = [command, model, "--hardware", hardware, "--max-devices", "8", "--json"]
    for words in extra:
        argv += words
    code, out, err = _run_cli(argv, capsys)
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        _one_error_line(err)
        return
    answer = _strict_json(out)
    rows = answer["plans"] if command == "plan" else [r["plan"] for r in answer["hardware"] if r.get("plan")]
    for row in rows:
        check_estimate(row)


# --- the Python API -------------------------------------------------------------------------------
@st.composite
def api_config(draw: st.DrawFn) -> dict[str, Any]:
    """A configuration the model handles, or nearly: small models, small layouts."""
    model = draw(st.sampled_from(SMALL_MODELS))
    kw: dict[str, Any] = {
        "model": model,
        "hardware": draw(st.sampled_from(["h100-sxm", "a100-80gb", "mi300x", "b200", "tpu-v5p", "gaudi3"])),
        "devices": draw(st.sampled_from([1, 2, 4, 8])),
        "seq_len": draw(st.sampled_from([256, 512, 1024, 2048])),
        "micro_batch": draw(st.sampled_from([1, 2, 4])),
        "zero": draw(st.sampled_from([0, 1, 2, 3])),
        "precision": draw(st.sampled_from(["bf16", "fp16", "fp32", "fp8"])),
        "method": draw(st.sampled_from(["pretrain", "full", "lora", "qlora"])),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "attention": draw(st.sampled_from(["flash", "eager"])),
    }
    if kw["devices"] > 1 and draw(st.booleans()):
        kw[draw(st.sampled_from(["tp", "pp", "cp"]))] = 2
    if draw(st.booleans()):
        kw["tokens"] = draw(st.sampled_from([1e6, 1e9, 1e12]))
    return kw


def _estimate(kw: Mapping[str, Any]) -> dict[str, Any] | None:
    """``trainplan.estimate(**kw).to_dict()``, or ``None`` when refused with a typed error."""
    kw = dict(kw)
    model = kw.pop("model")
    try:
        return trainplan.estimate(model, **kw).to_dict()
    except TrainplanError as err:
        assert err.field and err.message
        return None


MODEL_STATE_KEYS: Final = ("weights_bytes", "gradients_bytes", "optimizer_bytes")


@seed(SEED)
@FUZZ
@given(kw=api_config())
def test_api_answers_hold_the_invariants(kw: dict[str, Any]) -> None:
    _count("api estimate")
    d = _estimate(kw)
    if d is not None:
        _count("api estimate (answered)")
        check_estimate(d)
        json.dumps(d, allow_nan=False)


@seed(SEED)
@FUZZ
@given(kw=api_config(), field=st.sampled_from(["micro_batch", "seq_len"]))
def test_memory_is_monotone_in_micro_batch_and_sequence(kw: dict[str, Any], field: str) -> None:
    _count("api monotone")
    small = _estimate(kw)
    large = _estimate({**kw, field: kw[field] * 2})
    if small is None or large is None:
        return
    assert large["memory"]["per_device_bytes"] >= small["memory"]["per_device_bytes"] * (1 - 1e-12), field


@seed(SEED)
@FUZZ
@given(kw=api_config())
def test_model_states_shrink_with_each_zero_stage(kw: dict[str, Any]) -> None:
    _count("api zero")
    states = []
    for zero in (0, 1, 2, 3):
        d = _estimate({**kw, "zero": zero})
        states.append(None if d is None else sum(d["memory"][k] for k in MODEL_STATE_KEYS))
    known = [s for s in states if s is not None]
    assert known == sorted(known, reverse=True), states


INPUT_KEYS: Final = ("hardware", "devices", "system", "recipe", "layout")
"""The keys of an estimate that echo its inputs; every other key is part of the answer."""


def _flag_values(f: inputs.Field, kw: Mapping[str, Any]) -> list[object]:
    """Values of field ``f`` other than its default to try on configuration ``kw``."""
    if f.type is bool:
        return [True]
    if f.choices is not None:
        return [c for c in f.choices if c != kw.get(f.name, f.default)]
    return {
        "lora_rank": [4],
        "lora_targets": ["q,v"],
        "dropout": [0.1],
        "loss_chunks": [4],
        "global_batch": [kw["devices"] * kw["micro_batch"] * 4],
        "tokens": [1e10],
        "price": [1.0],
        "provider": ["aws"],
        "pue": [1.5],
        "virtual_stages": [2],
        "tp": [2],
        "pp": [2],
        "cp": [2],
        "ep": [2],
        "devices": [kw["devices"] * 2],
        "host_memory": [64.0],
        "device_mtbf": [1000.0],
        "checkpoint_bandwidth": [10.0],
        "restart_time": [60.0],
        "checkpoint_interval": [5.0],
    }.get(f.name, [])


SAME_AS_DEFAULT_METHOD: Final = ("full", "pretrain", "dpo", "ppo", "grpo")
"""Methods whose estimate is the default's by definition: a full fine-tune is the same step as
pre-training (they differ in the planner's default global batch), and the RLHF methods are
checked by their own tests."""
FLAG_FIELDS: Final = tuple(f for f in inputs.ESTIMATE_FIELDS if f.name not in ("hardware_file",))


@seed(SEED)
@FUZZ
@given(kw=api_config(), f=st.sampled_from(FLAG_FIELDS))
def test_every_accepted_flag_changes_the_answer(kw: dict[str, Any], f: inputs.Field) -> None:
    _count("api flag effect")
    base = _estimate(kw)
    if base is None:
        return
    for value in _flag_values(f, kw):
        if value == kw.get(f.name, f.default):
            continue
        if f.name == "method" and value in SAME_AS_DEFAULT_METHOD:
            continue
        if f.name == "recompute_early_stop" and kw["recompute"] not in ("full", "sac"):
            continue  # an engine setting (how a checkpoint re-runs), which the planner's full recompute uses
        if f.name == "zero" and base["layout"]["dp"] * base["layout"]["cp"] == 1 and value != 3:
            continue  # ZeRO-1/2 over one rank: the stage a published config names, nothing to shard
        if f.name == "provider" and str(base["run"]["price_source"] or "").lower().startswith(str(value)):
            continue  # the provider asked for is the one the catalog's cheapest price comes from
        other = _estimate({**kw, f.name: value})
        if other is None:
            continue  # refused with a typed error
        _count("api flag effect (answered) compared")
        same = all(base[k] == other.get(k) for k in base if k not in INPUT_KEYS)
        assert not same, f"{f.name}={value!r} accepted and changes nothing on {kw}"


INFINITE: Final = st.sampled_from([math.inf, -math.inf, math.nan, 1e300, 2**70, -3, 0, True, 2.5, "8", None])


@seed(SEED)
@FUZZ
@given(
    field=st.sampled_from(["num_experts", "top_k", "expert_ffn_hidden", "layer_freq", "num_shared_experts"]),
    value=INFINITE,
)
def test_typed_inputs_refuse_bad_numbers(field: str, value: object) -> None:
    """``ModelSpec``/``MoESpec``/``Recipe``/``Layout`` built by hand validate their numbers."""
    _count("api typed inputs")
    from dataclasses import replace

    from trainplan.models import load_model

    moe = load_model("mixtral-8x7b").moe
    assert moe is not None
    try:
        spec = replace(load_model("mixtral-8x7b"), moe=replace(moe, **{field: value}))
    except TrainplanError:
        return
    d = trainplan.estimate(spec, hardware="h100-sxm", devices=8, zero=3, seq_len=1024).to_dict()
    check_estimate(d)


# --- the web API ----------------------------------------------------------------------------------
JSON_SCALARS: Final = st.one_of(
    st.none(), st.booleans(), EDGE_INTS, st.floats(allow_nan=False, allow_infinity=False), JUNK_TEXT
)
JSON_VALUES: Final = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
BODY_FIELDS: Final = ("model", "hardware", *(f.name for f in inputs.ESTIMATE_FIELDS), "config", "nonsense")


@st.composite
def web_body(draw: st.DrawFn) -> object:
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON_VALUES)  # not even an object
    body: dict[str, object] = {
        "model": draw(st.sampled_from(MODELS)),
        "hardware": draw(st.sampled_from(HARDWARE)),
    }
    for name in draw(st.lists(st.sampled_from(BODY_FIELDS), max_size=5, unique=True)):
        field = next((f for f in inputs.ESTIMATE_FIELDS if f.name == name), None)
        if field is not None and draw(st.booleans()):
            text = draw(_value_text(field))
            body[name] = True if field.type is bool else text
        else:
            body[name] = draw(JSON_VALUES)
    return body


@seed(SEED)
@FUZZ
@given(body=web_body())
def test_web_estimate_answers_or_refuses_with_a_typed_error(body: object) -> None:
    _count("web estimate")
    try:
        answer = web_api.estimate(body)
    except TrainplanError as err:
        assert err.field is not None
        return
    _count("web estimate (answered)")
    json.dumps(answer, allow_nan=False)
    check_estimate(answer)


@pytest.fixture(scope="module")
def server() -> Iterator[TrainplanServer]:
    srv = make_server("127.0.0.1", 0, timeout_s=5.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


@seed(SEED)
@settings(FUZZ, max_examples=max(2, EXAMPLES // 2))
@given(
    path=st.sampled_from(["/api/estimate", "/api/plan", "/api/compare", "/api/nothing", "/"]),
    body=st.one_of(web_body().map(lambda b: json.dumps(b).encode()), st.binary(max_size=64)),
    headers=st.sampled_from(
        [{}, {"Origin": "https://attacker.example"}, {"Content-Type": "text/plain"}, {"Host": "evil.example"}]
    ),
)
def test_live_server_never_answers_5xx(
    server: TrainplanServer,
    path: str,
    body: bytes,
    headers: dict[str, str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    _count("web live")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        res = conn.getresponse()
        data = res.read()
    finally:
        conn.close()
    assert res.status < 500, (res.status, data[:300])
    if res.getheader("Content-Type") == "application/json":
        _strict_json(data.decode())
    if "Origin" in headers or "Host" in headers:
        assert res.status == 403
    assert "Traceback" not in capfd.readouterr().err
