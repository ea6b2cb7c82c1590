"""The web API against a real server on 127.0.0.1 (ephemeral port), and the CLI plots."""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from trainplan.cli import main as cli_main
from trainplan.web import ROUTES, make_server
from trainplan.web.server import TrainplanServer, static_files

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[TrainplanServer]:
    srv = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def request(
    srv: TrainplanServer,
    method: str,
    path: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    host, port = srv.server_address[0], srv.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=TIMEOUT_S)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        res = conn.getresponse()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
    finally:
        conn.close()


def api(srv: TrainplanServer, method: str, path: str, body: object = None, **kw: Any) -> tuple[int, Any]:
    status, headers, data = request(srv, method, path, body, **kw)
    assert headers["content-type"] == "application/json"
    text = data.decode()
    assert "Traceback" not in text
    return status, json.loads(text)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert cli_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- estimate equals the CLI --------------------------------------------------------------------
CASES = [
    (
        {"model": "llama-2-7b", "hardware": "h100", "devices": 8, "zero": 3, "tokens": 1e11},
        ["llama-2-7b", "--hardware", "h100", "--devices", "8", "--zero", "3", "--tokens", "1e11"],
    ),
    (
        {
            "model": "llama-3.1-70b",
            "hardware": "h200",
            "devices": 64,
            "tp": 8,
            "pp": 2,
            "sequence_parallel": True,
            "pp_schedule": "interleaved",
            "virtual_stages": 2,
            "zero": 1,
            "micro_batch": 2,
            "global_batch": 128,
            "recompute": "selective",
            "tokens": "2e12",
            "price": 3.5,
        },
        [
            "llama-3.1-70b",
            "--hardware",
            "h200",
            "--devices",
            "64",
            "--tp",
            "8",
            "--pp",
            "2",
            "--sequence-parallel",
            "--pp-schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--zero",
            "1",
            "--micro-batch",
            "2",
            "--global-batch",
            "128",
            "--recompute",
            "selective",
            "--tokens",
            "2e12",
            "--price",
            "3.5",
        ],
    ),
    (
        {
            "model": "llama-2-7b",
            "hardware": "rtx-4090",
            "method": "qlora",
            "lora_rank": 8,
            "lora_targets": ["q", "v"],
            "seq_len": 2048,
            "loss_chunks": 8,
            "paged_optimizer": True,
        },
        [
            "llama-2-7b",
            "--hardware",
            "rtx-4090",
            "--method",
            "qlora",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--seq-len",
            "2048",
            "--loss-chunks",
            "8",
            "--paged-optimizer",
        ],
    ),
    (
        {"model": "mixtral-8x7b", "hardware": "mi300x", "devices": 16, "ep": 8, "zero": 2, "tokens": 1e10},
        [
            "mixtral-8x7b",
            "--hardware",
            "mi300x",
            "--devices",
            "16",
            "--ep",
            "8",
            "--zero",
            "2",
            "--tokens",
            "1e10",
        ],
    ),
]


@pytest.mark.parametrize(("body", "argv"), CASES, ids=["zero3", "tp-pp-sp", "qlora", "moe-ep"])
def test_estimate_json_equals_the_cli(
    server: TrainplanServer, capsys: pytest.CaptureFixture[str], body: dict[str, object], argv: list[str]
) -> None:
    status, got = api(server, "POST", "/api/estimate", body)
    assert status == 200, got
    terms = got.pop("terms")
    assert got == cli_json(capsys, "estimate", *argv)
    # the plotted parts add up to the totals the CLI prints
    assert sum(t["bytes"] for t in terms["memory"]) == pytest.approx(
        got["memory"]["per_device_bytes"], rel=1e-12
    )
    assert sum(t["s"] for t in terms["time"]) == pytest.approx(got["time"]["step_s"], rel=1e-12)
    assert {t["group"] for t in terms["time"]} <= {
        "compute",
        "communication",
        "bubble",
        "optimizer",
        "offload",
        "rollout",
        "scoring",
        "critic",
        "sync",
    }
    # a training step has no RL terms
    assert all(t["s"] == 0 for t in terms["time"] if t["group"] in ("rollout", "scoring", "critic", "sync"))


def test_uploaded_config_equals_the_cli_on_the_file(
    server: TrainplanServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "tiny-llama.json"
    path.write_text(json.dumps(cfg))
    status, got = api(
        server,
        "POST",
        "/api/estimate",
        {"config": cfg, "config_name": "tiny-llama", "hardware": "a100-80gb", "devices": 2, "zero": 3},
    )
    assert status == 200, got
    got.pop("terms")
    want = cli_json(capsys, "estimate", str(path), "--hardware", "a100-80gb", "--devices", "2", "--zero", "3")
    assert got == want


# --- bad input: 400 (or 413) naming the field -------------------------------------------------------
BAD = [
    ({"hardware": "h100"}, "model"),
    ({"model": "/etc/passwd", "hardware": "h100"}, "model"),
    ({"model": "../../config.json", "hardware": "h100"}, "model"),
    ({"model": "llama-2-7b", "hardware": "no-such-chip"}, "hardware"),
    ({"model": "llama-2-7b", "hardware": "h100", "tp": 0}, "tp"),
    ({"model": "llama-2-7b", "hardware": "h100", "tp": "two"}, "tp"),
    ({"model": "llama-2-7b", "hardware": "h100", "tp": True}, "tp"),
    ({"model": "llama-2-7b", "hardware": "h100", "sequence_parallel": "yes"}, "sequence_parallel"),
    ({"model": "llama-2-7b", "hardware": "h100", "precision": "fp7"}, "precision"),
    ({"model": "llama-2-7b", "hardware": "h100", "devices": 8, "tp": 3}, "devices"),
    ({"model": "llama-2-7b", "hardware": "h100", "devices": 3, "tp": 3}, "tp"),
    ({"model": "llama-2-7b", "hardware": "h100", "colour": "red"}, "colour"),
    ({"model": "llama-2-7b", "hardware": "h100", "tokens": 1e400}, "tokens"),
    ({"model": "llama-2-7b", "config": {"model_type": "llama"}, "hardware": "h100"}, "model"),
    ({"config": [1, 2], "hardware": "h100"}, "config"),
    ({"config": "{}", "hardware": "h100"}, "config"),
    ({"config": {"model_type": "bert"}, "hardware": "h100"}, "model_type"),
    ({"config": {"hidden_size": 8}, "hardware": "h100"}, "model_type"),
    ({"config": {"model_type": "llama", "hidden_size": 64}, "hardware": "h100"}, None),
    ({"config": {"model_type": "llama"}, "config_name": 7, "hardware": "h100"}, "config_name"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_estimate_requests_are_400_naming_the_field(
    server: TrainplanServer, body: dict[str, object], field: str | None
) -> None:
    raw = json.dumps(body).replace("Infinity", "1e400").encode()
    status, got = api(server, "POST", "/api/estimate", raw=raw)
    assert status == 400, got
    err = got["error"]
    assert set(err) == {"field", "message"} and err["message"]
    if field is not None:
        assert err["field"] == field, err
    else:  # a config missing keys: the first missing key is named
        assert isinstance(err["field"], str) and err["field"] not in ("body", "model")


def test_config_over_the_size_limit_is_400_naming_config(server: TrainplanServer) -> None:
    big = {"model_type": "llama", "padding": "x" * 1_200_000}
    status, got = api(server, "POST", "/api/estimate", {"config": big, "hardware": "h100"})
    assert status == 400
    assert got["error"]["field"] == "config" and "1,000,000-byte limit" in got["error"]["message"]


def test_body_over_the_limit_is_413_without_reading_it(server: TrainplanServer) -> None:
    host, port = server.server_address[0], server.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=TIMEOUT_S)
    try:  # announce a 2.1 MB body, send none of it: the server answers from the headers alone
        conn.putrequest("POST", "/api/estimate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", "2100000")
        conn.endheaders()
        res = conn.getresponse()
        got = json.loads(res.read())
    finally:
        conn.close()
    assert res.status == 413 and got["error"]["field"] == "body"
    assert "2,000,000-byte limit" in got["error"]["message"]


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"\xff\xfe", b"[1, 2]", b"[" * 100_000 + b"]" * 100_000, b"null"],
    ids=["syntax", "not-utf8", "array", "deep", "null"],
)
def test_malformed_bodies_are_400_body(server: TrainplanServer, raw: bytes) -> None:
    status, got = api(server, "POST", "/api/estimate", raw=raw)
    assert status == 400 and got["error"]["field"] == "body", got


def test_unknown_paths_and_methods_are_json_errors(server: TrainplanServer) -> None:
    assert api(server, "GET", "/api/nothing")[0] == 404
    assert api(server, "GET", "/static/../../etc/passwd")[0] == 404
    assert api(server, "POST", "/api/nothing", {})[0] == 404
    assert api(server, "GET", "/api/estimate")[0] == 405
    assert api(server, "DELETE", "/api/models")[0] == 405


def test_only_loopback_host_names_with_the_bound_port_are_answered(server: TrainplanServer) -> None:
    port = server.port
    for host in (
        f"attacker.example:{port}",
        "localhost:1",
        "127.0.0.1",
        f"[::1]:{port + 1}",
        "",
        f"x:{port}:1",
    ):
        status, got = api(server, "GET", "/api/models", headers={"Host": host})
        assert status == 403 and got["error"]["field"] == "Host", host
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert api(server, "GET", "/api/models", headers={"Host": host})[0] == 200, host


ESTIMATE_BODY: Final = {"model": "llama-3.2-1b", "hardware": "h100-sxm"}


@pytest.mark.parametrize(
    "origin",
    ["https://attacker.example", "http://attacker.example", "null", "http://127.0.0.1:1", "file://"],
)
def test_cross_site_posts_are_403_before_the_body_is_read(server: TrainplanServer, origin: str) -> None:
    """A web page elsewhere can send a "simple" text/plain POST without a CORS preflight; it
    carries the page's Origin, which is not this server's."""
    raw = json.dumps(ESTIMATE_BODY).encode()
    status, got = api(
        server, "POST", "/api/estimate", raw=raw, headers={"Content-Type": "text/plain", "Origin": origin}
    )
    assert status == 403 and got["error"]["field"] == "Origin"


def test_fetch_site_cross_site_is_403(server: TrainplanServer) -> None:
    status, got = api(
        server, "POST", "/api/estimate", ESTIMATE_BODY, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert status == 403 and got["error"]["field"] == "Origin"


def test_same_origin_and_originless_requests_are_answered(server: TrainplanServer) -> None:
    port = server.port
    for headers in ({}, {"Origin": f"http://127.0.0.1:{port}"}, {"Origin": f"http://localhost:{port}"}):
        assert api(server, "POST", "/api/estimate", ESTIMATE_BODY, headers=headers)[0] == 200, headers
        assert api(server, "GET", "/api/models", headers=headers)[0] == 200, headers


def _raw_exchange(srv: TrainplanServer, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: 127.0.0.1:{port}\r\n\r\n", 400),
        (b"GET / HTTP/x\r\n\r\n", 400),
        (b"BREW /api/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", 405),
        (b"OPTIONS /api/estimate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n", 405),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_malformed_http_and_unknown_methods_are_4xx_json(
    server: TrainplanServer, request_bytes: bytes, status: int, capfd: pytest.CaptureFixture[str]
) -> None:
    reply = _raw_exchange(server, request_bytes.replace(b"{port}", str(server.port).encode()))
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode(), head
    assert b"application/json" in head and "error" in json.loads(body)
    assert "Traceback" not in capfd.readouterr().err


def test_clients_that_hang_up_or_stall_leave_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    srv = make_server("127.0.0.1", 0, timeout_s=0.5)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        host = f"Host: 127.0.0.1:{srv.port}\r\n".encode()
        # a body shorter than its Content-Length, then silence: dropped after the timeout
        stalled = b"POST /api/estimate HTTP/1.1\r\n" + host + b"Content-Length: 100\r\n\r\n{"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S) as sock:
            sock.sendall(stalled)
            assert sock.recv(65536) == b""  # closed by the server, no answer to a half request
        # a client that closes before its body is complete
        with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S) as sock:
            sock.sendall(stalled)
        # a request line and nothing else
        with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT_S) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")
            assert sock.recv(65536) == b""
        # the server still answers
        assert api(srv, "GET", "/api/models")[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
    assert "Traceback" not in capfd.readouterr().err


# --- catalog endpoints equal the CLI ---------------------------------------------------------------
def test_models_and_hardware_equal_the_cli(
    server: TrainplanServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert api(server, "GET", "/api/models") == (200, cli_json(capsys, "models"))
    assert api(server, "GET", "/api/hardware") == (200, cli_json(capsys, "hardware", "list"))


# --- compare and plan equal the CLI ------------------------------------------------------------------
def _without_seconds(d: Any) -> Any:
    d["search"].pop("seconds")
    return d


def test_compare_json_equals_the_cli(server: TrainplanServer, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model": "llama-2-7b", "hardware": ["h100", "mi300x", "a100-40gb"], "devices": 8, "tokens": 1e11}
    status, got = api(server, "POST", "/api/compare", body)
    assert status == 200, got
    want = cli_json(
        capsys,
        "compare",
        "llama-2-7b",
        "--hardware",
        "h100,mi300x,a100-40gb",
        "--devices",
        "8",
        "--tokens",
        "1e11",
    )
    assert _without_seconds(got) == _without_seconds(want)
    assert {b["hardware"] for b in got["hardware"]} == {"h100-sxm", "mi300x", "a100-40gb"}


def test_plan_json_equals_the_cli(server: TrainplanServer, capsys: pytest.CaptureFixture[str]) -> None:
    body = {
        "model": "llama-3.2-1b",
        "hardware": "h100,mi300x",
        "tokens": 1e10,
        "max_devices": 16,
        "top": 4,
        "recompute": "none",
        "device_price": ["mi300x=2.5"],
    }
    status, got = api(server, "POST", "/api/plan", body)
    assert status == 200, got
    for key in ("fastest", "cheapest", "pareto", "plans"):
        assert key in got
    want = cli_json(
        capsys,
        "plan",
        "llama-3.2-1b",
        "--hardware",
        "h100,mi300x",
        "--tokens",
        "1e10",
        "--max-devices",
        "16",
        "--top",
        "4",
        "--recompute",
        "none",
        "--device-price",
        "mi300x=2.5",
    )
    assert _without_seconds(got) == _without_seconds(want)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/plan", {"model": "llama-2-7b", "objective": "fun"}, "objective"),
        ("/api/plan", {"model": "llama-2-7b", "max_devices": 100000}, "max_devices"),
        ("/api/plan", {"model": "llama-2-7b", "hardware_file": "/etc/passwd"}, "hardware_file"),
        ("/api/plan", {"model": "llama-2-7b", "devices": ["x"]}, "devices"),
        ("/api/plan", {"model": "llama-2-7b", "device_price": ["h100"]}, "device_price"),
        ("/api/compare", {"model": "llama-2-7b"}, "hardware"),
        ("/api/compare", {"model": "llama-2-7b", "hardware": []}, "hardware"),
        ("/api/compare", {"model": "llama-2-7b", "hardware": ["h100"], "devices": 0}, "devices"),
        ("/api/compare", {"model": "llama-2-7b", "hardware": ["h100"], "tp": 2}, "tp"),
    ],
)
def test_bad_plan_and_compare_requests(server: TrainplanServer, path: str, body: object, field: str) -> None:
    status, got = api(server, "POST", path, body)
    assert status == 400 and got["error"]["field"] == field, got


# --- the OpenAPI document ---------------------------------------------------------------------------
def test_openapi_lists_every_route_and_field(server: TrainplanServer) -> None:
    from trainplan.web.api import estimate_flags

    status, doc = api(server, "GET", "/api/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    listed = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert listed == {(r.method, r.path) for r in ROUTES}
    for r in ROUTES:  # and every listed route answers (POSTs with a bad body: 400, not 404)
        code = request(server, r.method, r.path, {} if r.method == "POST" else None)[0]
        assert code in (200, 400), (r, code)
    props = doc["components"]["schemas"]["EstimateRequest"]["properties"]
    assert set(props) == {f.name for f in estimate_flags()} | {
        "model",
        "config",
        "config_name",
        "strict",
        "hardware",
    }
    assert props["zero"]["enum"] == [0, 1, 2, 3] and props["seq_len"]["default"] == 4096
    # every $ref resolves
    text = json.dumps(doc)
    for ref in set(re.findall(r'"\$ref": "#/components/schemas/([A-Za-z]+)"', text)):
        assert ref in doc["components"]["schemas"]


# --- the page itself ---------------------------------------------------------------------------------
def test_page_and_static_files_are_served_offline(server: TrainplanServer) -> None:
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]
    html = body.decode()
    for src in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert src.startswith(("/", "data:")), f"page loads {src} from elsewhere"
        if src.startswith("/static/"):
            assert request(server, "GET", src)[0] == 200
    # nothing in the page's files names a host: it works without a network
    for name, (data, _) in static_files().items():
        urls = re.findall(rb"https?://[^\s\"')]+", data)
        assert all(u.startswith(b"http://www.w3.org/") for u in urls), (name, urls)


def test_serve_subcommand_registers_and_runs() -> None:
    from trainplan.web.cli import register

    parser = argparse.ArgumentParser(prog="trainplan")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8321)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--port", "70000"])

    proc = subprocess.Popen(
        [sys.executable, "-m", "trainplan.web", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=TIMEOUT_S)
        conn.request("GET", "/api/models")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- plots for the CLI -------------------------------------------------------------------------------
def _estimate() -> Any:
    from trainplan.hardware import System, get_accelerator
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.predict import estimate
    from trainplan.recipe import Recipe

    system = System(accelerator=get_accelerator("h100"), num_devices=8)
    layout = Layout.for_devices(8, tp=2, pp=2, zero=1)
    return estimate(system, load_model("llama-2-13b"), Recipe(tokens=1e11, global_batch=64), layout)


def test_save_plot_writes_every_kind(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")
    from trainplan.web import api as web_api
    from trainplan.web.plots import KINDS, save_plot

    est = _estimate()
    from trainplan.web.plan_api import compare as web_compare

    compare = web_compare({"model": "llama-2-13b", "hardware": ["h100", "mi300x", "tpu-v4"], "devices": 8})
    plan_like = {
        "model": "llama-2-13b",
        "tokens": 1e11,
        "plans": [web_api.estimate_payload(est) | {"label": "8×h100-sxm"}],
        "pareto": [web_api.estimate_payload(est) | {"label": "8×h100-sxm"}],
        "fastest": {"label": "8×h100-sxm"},
        "cheapest": None,
    }
    data = {
        "estimate": est,
        "memory": est,
        "time": web_api.estimate_payload(est),
        "plan": plan_like,
        "compare": compare,
    }
    for kind in KINDS:
        out = save_plot(kind, data[kind], tmp_path / f"{kind}.png")
        assert out.read_bytes().startswith(b"\x89PNG"), kind
    assert b"<svg" in save_plot("estimate", est, tmp_path / "estimate.svg").read_bytes()[:2000]
    # compare also takes a list of estimates
    assert save_plot("compare", [est, est], tmp_path / "list.png").stat().st_size > 0


def test_save_plot_rejects_bad_names(tmp_path: Path) -> None:
    from trainplan.errors import TrainplanError
    from trainplan.web.plots import save_plot

    with pytest.raises(TrainplanError, match=r"\.png or \.svg") as exc:
        save_plot("estimate", {}, tmp_path / "x.jpg")
    assert exc.value.field == "plot"
    with pytest.raises(TrainplanError, match="unknown plot"):
        save_plot("pie", {}, tmp_path / "x.png")


def test_save_plot_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainplan.errors import TrainplanError
    from trainplan.web.plots import save_plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(TrainplanError) as exc:
        save_plot("estimate", _estimate(), tmp_path / "x.png")
    assert "trainplan[plot]" in str(exc.value) and "\n" not in str(exc.value)


# --- the RL fields of the form -------------------------------------------------------------------------
def test_form_has_an_rl_fieldset_driven_by_the_schema(server: TrainplanServer) -> None:
    from trainplan import inputs

    status, doc = api(server, "GET", "/api/openapi.json")
    props = doc["components"]["schemas"]["EstimateRequest"]["properties"]
    for f in inputs.RLHF_FIELDS:
        assert props[f.name]["x-group"] == "rlhf", f.name
    assert props["devices"]["x-group"] != "rlhf"
    html = request(server, "GET", "/")[2].decode()
    assert 'id="group-rlhf"' in html
    app = static_files()["/static/app.js"][0].decode()
    assert '"group-rlhf"' in app and 'spec["x-group"] === "rlhf"' in app
    # A choice without a default gets a blank first option: an RL choice is not sent with a full
    # fine-tune (the API refuses RL settings with other methods).
    assert "spec.default === undefined || spec.default === null" in app
    status, err = api(
        server, "POST", "/api/estimate", {"model": "llama-2-7b", "hardware": "h100-sxm", "actor": "full"}
    )
    assert status == 400 and err["error"]["field"] == "actor"


def test_disaggregated_rl_job_through_the_api(server: TrainplanServer) -> None:
    body = {
        "model": "llama-2-7b",
        "hardware": "h100-sxm",
        "devices": 8,
        "method": "ppo",
        "zero": 3,
        "recompute": "full",
        "global_batch": 64,
        "placement": "disaggregated",
        "groups": "actor=2,critic=2,ref=1,reward=1,rollout=2",
    }
    status, doc = api(server, "POST", "/api/estimate", body)
    assert status == 200, doc
    assert [g["group"] for g in doc["rlhf"]["groups"]] == ["actor", "critic", "ref", "reward", "rollout"]
    assert doc["rlhf"]["split_s"]["rollout"] > 0


def _estimate_payload(model: str, hardware: str, **fields: object) -> dict[str, Any]:
    from trainplan.web import api as web_api

    return web_api.estimate({"model": model, "hardware": hardware, **fields})


# Bars with the most and the longest memory terms: ZeRO-3 with offload, far over capacity, RLHF.
MEMORY_CASES: Final = (
    ("llama-3.1-8b", "h100-sxm", {"devices": 8, "zero": 3, "recompute": "selective", "offload": "optimizer"}),
    ("llama-3.1-70b", "h100-sxm", {}),
    ("llama-3.1-8b", "h100-sxm", {"method": "grpo"}),
    ("llama-2-13b", "h100-sxm", {"devices": 8, "tp": 2, "pp": 2, "zero": 1, "stack": "pytorch"}),
)


def _lab(color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB hex colour (IEC 61966-2-1 transfer, CIE 15:2004 Lab)."""
    lin = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in lin)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = (v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in (x, y, z))
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_memory_palette_colours_are_far_apart() -> None:
    import itertools
    import math

    from trainplan.palette import MEMORY_PALETTE, PREFERRED

    assert len(set(MEMORY_PALETTE)) == len(MEMORY_PALETTE) >= 20
    nearest = min(math.dist(_lab(a), _lab(b)) for a, b in itertools.combinations(MEMORY_PALETTE, 2))
    assert nearest > 15  # CIE76 ΔE: well past "just noticeable" (≈2.3) for every pair
    assert len(set(PREFERRED.values())) == len(PREFERRED)


@pytest.mark.parametrize(("model", "hardware", "fields"), MEMORY_CASES)
def test_memory_terms_carry_distinct_colours(model: str, hardware: str, fields: dict[str, object]) -> None:
    from trainplan.palette import memory_colors

    terms = _estimate_payload(model, hardware, **fields)["terms"]["memory"]
    colors = [t["color"] for t in terms]
    assert len(set(colors)) == len(colors), terms
    assert colors == memory_colors([t["name"] for t in terms])
    # past the palette: colours repeat, never side by side
    many = memory_colors([f"term {i}" for i in range(45)])
    assert all(a != b for a, b in itertools.pairwise(many))


@pytest.mark.parametrize(("model", "hardware", "fields"), MEMORY_CASES)
def test_plot_labels_do_not_overlap(model: str, hardware: str, fields: dict[str, object]) -> None:
    pytest.importorskip("matplotlib", reason="plots need the plot extra (matplotlib)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from trainplan.web.plots import figure

    fig = figure("estimate", _estimate_payload(model, hardware, **fields))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_window_extent(renderer).width > 0
    ]
    overlapping = [(a, b) for i, (a, p) in enumerate(boxes) for b, q in boxes[i + 1 :] if p.overlaps(q)]
    assert overlapping == []
    legend_colors = [
        h.get_facecolor()
        for ax in fig.axes[:1]
        for h in ax.get_legend().legend_handles  # memory panel
    ]
    assert len(set(legend_colors)) == len(legend_colors)
