"""The page end to end in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium).

The numbers the page shows must equal ``trainplan estimate --json``'s. Skipped, with the reason,
where Selenium, chromium or chromedriver is missing; with ``TRAINPLAN_REQUIRE_BROWSER=1`` (CI) a
missing browser fails instead. The screenshot is saved under the test's tmp path (the artifact)
and, with TRAINPLAN_UPDATE_SCREENSHOT=1, as docs/img/web.png (the README's picture of the page).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainplan.cli import main as cli_main
from trainplan.units import fmt_duration
from trainplan.web import make_server
from trainplan.web.server import TrainplanServer

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "img" / "web.png"
WAIT_S = 60.0
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
        if path:
            return path
    return None


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _find("chromium", "chromium-browser") is None:
        return "chromium is not installed (apt-get install -y chromium chromium-driver)"
    if _find("chromedriver") is None:
        return "chromedriver is not installed (apt-get install -y chromium-driver)"
    return None


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    why = _missing()
    if why:
        if os.environ.get("TRAINPLAN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser test required (TRAINPLAN_REQUIRE_BROWSER=1) but {why}")
        pytest.skip(f"no headless browser: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="trainplan-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(_find("chromium", "chromium-browser"))
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(str(_find("chromedriver"))), options=options)
    drv.set_page_load_timeout(WAIT_S)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


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


def wait(drv: Any, cond: Callable[[Any], object], what: str) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(drv, WAIT_S, poll_frequency=0.1).until(cond)
    except TimeoutException:
        body = drv.find_element("tag name", "body").get_attribute("outerHTML")[:2000]
        errors = drv.find_element("id", "error").text
        pytest.fail(f"timed out waiting for {what}; error box: {errors!r}; page: {body}")


def body_data(drv: Any, key: str) -> str | None:
    value: str | None = drv.execute_script(f"return document.body.dataset.{key} || null")
    return value


def set_field(drv: Any, element_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    el = drv.find_element("id", element_id)
    if el.tag_name == "select":
        Select(el).select_by_value(value)
    else:
        el.clear()
        el.send_keys(value)


def settled(drv: Any) -> bool:
    return body_data(drv, "pending") == "0" and body_data(drv, "estimate") in ("done", "error")


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert cli_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_page_estimate_equals_the_cli_then_compare_and_plan(
    driver: Any, server: TrainplanServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    drv = driver
    drv.get(server.url)
    wait(drv, lambda d: body_data(d, "ready") == "yes" and settled(d), "the page to load")

    set_field(drv, "model", "llama-2-13b")
    set_field(drv, "hardware", "h100-sxm")
    set_field(drv, "f-devices", "8")
    set_field(drv, "f-tp", "2")
    set_field(drv, "f-zero", "1")
    set_field(drv, "f-recompute", "selective")
    set_field(drv, "f-tokens", "2e11")
    drv.find_element("id", "estimate-btn").click()
    wait(
        drv,
        lambda d: (
            settled(d)
            and "llama-2-13b" in d.find_element("id", "headline").text
            and "tp 2" in d.find_element("id", "subline").text
        ),
        "the estimate of llama-2-13b with tp 2",
    )
    assert drv.find_element("id", "error").get_attribute("hidden") is not None

    want = cli_json(
        capsys,
        "estimate",
        "llama-2-13b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--tp",
        "2",
        "--zero",
        "1",
        "--recompute",
        "selective",
        "--tokens",
        "2e11",
    )
    total = drv.find_element("id", "mem-total")
    per_device = want["memory"]["per_device_bytes"]
    assert total.text == f"{per_device / 1e9:.2f} GB"
    assert float(total.get_attribute("data-bytes")) == per_device
    assert drv.find_element("id", "mem-capacity").text.startswith(
        f"of {want['memory']['capacity_bytes'] / 1e9:.2f} GB"
    )
    assert drv.find_element("id", "step-time").text == fmt_duration(want["time"]["step_s"])
    assert drv.find_element("id", "fits").text == ("fits" if want["memory"]["fits"] else "does not fit")
    assert drv.find_element("id", "cost").text == f"${round(want['run']['cost_usd']):,}"
    # the memory bar is drawn: one rectangle per non-zero term
    segs = drv.find_elements("css selector", "#memory-chart rect.seg")
    assert len(segs) >= 4

    # compare: the default selection (h100-sxm, h200, b200, mi300x, a100-80gb)
    drv.find_element("id", "compare-btn").click()
    wait(drv, lambda d: body_data(d, "compare") == "done", "the compare")
    checked = [
        el.get_attribute("value") for el in drv.find_elements("css selector", "#compare-list input:checked")
    ]
    assert drv.find_element("id", "compare-summary").text.startswith("fastest: ")
    assert len(drv.find_elements("css selector", "#compare-table tbody tr")) == len(checked) == 5
    assert len(drv.find_elements("css selector", "#compare-chart rect.seg")) >= 5

    # plan over the same accelerators, up to 64 devices
    set_field(drv, "p-max_devices", "64")
    drv.find_element("id", "plan-btn").click()
    wait(drv, lambda d: body_data(d, "plan") == "done", "the plan")
    from trainplan.web.plan_api import plan

    expected = plan(
        {"model": "llama-2-13b", "hardware": checked, "tokens": 2e11, "max_devices": 64, "top": 10}
    )
    first = drv.find_elements("css selector", "#plan-table tbody tr")[0].find_elements("tag name", "td")
    assert first[1].text == expected["plans"][0]["label"]
    assert first[5].text == fmt_duration(expected["plans"][0]["time"]["step_s"])
    assert drv.find_elements("css selector", "#pareto-chart circle")

    drv.execute_script("window.scrollTo(0, 0)")
    height = int(drv.execute_script("return document.documentElement.scrollHeight"))
    drv.set_window_size(1400, min(height + 20, 4000))
    artifact = tmp_path / "web.png"
    assert drv.save_screenshot(str(artifact))
    if os.environ.get("TRAINPLAN_UPDATE_SCREENSHOT") == "1":  # refresh the README's picture on demand
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifact, SCREENSHOT)
    assert artifact.read_bytes().startswith(b"\x89PNG")
    drv.set_window_size(1400, 1000)


def test_page_upload_and_errors(
    driver: Any, server: TrainplanServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    drv = driver
    drv.get(server.url)
    wait(drv, lambda d: body_data(d, "ready") == "yes" and settled(d), "the page to load")
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    set_field(drv, "hardware", "l40s")
    set_field(drv, "f-devices", "1")
    set_field(drv, "f-zero", "0")
    drv.find_element("id", "config-file").send_keys(str(path))
    wait(
        drv,
        lambda d: (
            settled(d)
            and d.find_element("id", "headline").text.startswith("config (")
            and "on 1 × l40s" in d.find_element("id", "headline").text
        ),
        "the uploaded model's estimate",
    )
    want = cli_json(capsys, "estimate", str(path), "--hardware", "l40s")
    assert drv.find_element("id", "mem-total").text == f"{want['memory']['per_device_bytes'] / 1e9:.2f} GB"

    # a layout that does not divide: the error names the field and marks its input
    set_field(drv, "f-devices", "8")
    set_field(drv, "f-tp", "3")
    drv.find_element("id", "estimate-btn").click()
    wait(drv, lambda d: settled(d) and body_data(d, "estimate") == "error", "the error")
    assert drv.find_element("id", "error").text.startswith("devices:")
    assert "bad" in drv.find_element("id", "f-devices").get_attribute("class")


def test_page_rl_fields_estimate_an_rl_job(
    driver: Any, server: TrainplanServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The RL fieldset (schema group ``rlhf``) sends its settings; the page shows the RL job's
    memory and step, equal to ``trainplan estimate --method ppo``'s."""
    drv = driver
    drv.get(server.url)
    wait(drv, lambda d: body_data(d, "ready") == "yes" and settled(d), "the page to load")
    assert drv.find_elements("css selector", "#group-rlhf #f-placement")
    drv.execute_script("document.getElementById('group-rl').open = true;")
    drv.execute_script("document.getElementById('group-more').open = true;")
    set_field(drv, "model", "llama-2-7b")
    set_field(drv, "hardware", "h100-sxm")
    set_field(drv, "f-devices", "8")
    set_field(drv, "f-zero", "3")
    set_field(drv, "f-global_batch", "64")
    set_field(drv, "f-method", "ppo")
    set_field(drv, "f-placement", "disaggregated")
    set_field(drv, "f-groups", "actor=2,critic=2,ref=1,reward=1,rollout=2")
    drv.find_element("id", "estimate-btn").click()
    want = cli_json(
        capsys,
        "estimate",
        "llama-2-7b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--zero",
        "3",
        "--global-batch",
        "64",
        "--method",
        "ppo",
        "--placement",
        "disaggregated",
        "--groups",
        "actor=2,critic=2,ref=1,reward=1,rollout=2",
    )
    wait(
        drv,
        lambda d: (
            settled(d) and d.find_element("id", "step-time").text == fmt_duration(want["time"]["step_s"])
        ),
        "the RL job's estimate",
    )
    assert drv.find_element("id", "mem-total").text == f"{want['memory']['per_device_bytes'] / 1e9:.2f} GB"


# --- stale results, defaults, reasons, memory colours ---------------------------------------------
STALE_BANNER = "these results are for the previous inputs"
RECORD_FETCH = """
window.__sent = [];
const real = window.fetch.bind(window);
window.fetch = (path, init) => {
  window.__sent.push({path, body: init && init.body ? JSON.parse(init.body) : null});
  if (path === "/api/plan" || path === "/api/compare") return Promise.reject(new Error("recorded"));
  return real(path, init);
};
"""


def load(drv: Any, server: TrainplanServer) -> None:
    drv.get(server.url)
    wait(drv, lambda d: body_data(d, "ready") == "yes" and settled(d), "the page to load")


def stale(drv: Any, panel: str) -> bool:
    marked = "stale" in (drv.find_element("id", f"{panel}-panel").get_attribute("class") or "")
    banner = drv.find_element("id", f"{panel}-stale")
    assert marked == banner.is_displayed(), f"{panel}: class and banner disagree"
    if marked:
        assert banner.text.startswith(STALE_BANNER)
    return marked


def check(drv: Any, ids: list[str]) -> None:
    """Check exactly these accelerators in the compare / plan list."""
    for el in drv.find_elements("css selector", "#compare-list input"):
        if el.is_selected() != (el.get_attribute("value") in ids):
            el.click()


def test_results_are_marked_stale_while_the_form_differs_or_has_an_error(
    driver: Any, server: TrainplanServer
) -> None:
    drv = driver
    load(drv, server)
    assert drv.find_element("id", "error").get_attribute("hidden") is not None
    assert not stale(drv, "estimate")
    # changed since the result was computed: stale at once, before the new estimate arrives
    marked = drv.execute_script(
        "const el = document.getElementById('f-seq_len'); el.value = '2048';"
        "el.dispatchEvent(new Event('input', {bubbles: true}));"
        "return document.getElementById('estimate-panel').classList.contains('stale')"
    )
    assert marked is True
    wait(drv, lambda d: settled(d) and "seq 2048" in d.find_element("id", "subline").text, "seq 2048")
    assert not stale(drv, "estimate")
    # an error: the previous result stays, marked stale, until a valid form is estimated
    before = drv.find_element("id", "mem-total").text
    set_field(drv, "f-tp", "3")
    wait(drv, lambda d: settled(d) and body_data(d, "estimate") == "error", "the error")
    assert stale(drv, "estimate")
    assert drv.find_element("id", "mem-total").text == before
    set_field(drv, "f-tp", "1")
    wait(drv, lambda d: settled(d) and body_data(d, "estimate") == "done", "the estimate again")
    assert not stale(drv, "estimate")

    # a plan is stale once the form or the plan's options change, until it is planned again
    check(drv, ["h100-sxm"])
    set_field(drv, "p-max_devices", "8")
    drv.find_element("id", "plan-btn").click()
    wait(drv, lambda d: body_data(d, "plan") == "done", "the plan")
    assert not stale(drv, "plan")
    set_field(drv, "p-max_devices", "16")
    assert stale(drv, "plan")
    set_field(drv, "p-max_devices", "8")
    assert not stale(drv, "plan")  # the form is back to the planned inputs
    set_field(drv, "f-seq_len", "1024")
    wait(drv, lambda d: settled(d) and "seq 1024" in d.find_element("id", "subline").text, "seq 1024")
    assert stale(drv, "plan") and not stale(drv, "estimate")
    drv.execute_script("document.body.dataset.plan = ''")
    drv.find_element("id", "plan-btn").click()
    wait(drv, lambda d: body_data(d, "plan") == "done", "the plan again")
    assert not stale(drv, "plan")


def _dom_default(drv: Any, element_id: str) -> object:
    el = drv.find_element("id", element_id)
    if el.get_attribute("type") == "checkbox":
        return el.is_selected()
    value: str = el.get_attribute("value")
    return None if value == "" else value


def test_form_defaults_are_the_clis(driver: Any, server: TrainplanServer) -> None:
    from trainplan import inputs
    from trainplan.web import api, plan_api

    drv = driver
    load(drv, server)
    # every field shown: its default is the CLI's (a select showing "" is the CLI's unset default)
    shown = {
        el.get_attribute("id")
        for el in drv.find_elements("css selector", "#form [id^='f-'], #plan-options [id^='p-']")
    }
    estimate_fields = {f.name: f for f in api.estimate_flags()}
    plan_fields = {f.name: f for f in plan_api.plan_flags(False)}
    assert {i[2:] for i in shown if i.startswith("f-")} == set(estimate_fields)
    for element_id in sorted(shown):
        field = (estimate_fields if element_id.startswith("f-") else plan_fields)[element_id[2:]]
        value = _dom_default(drv, element_id)
        if isinstance(value, bool):
            assert value == field.default, element_id
        else:
            assert field.parse(value) == field.parse(None), f"{element_id}: {value!r} vs {field.default!r}"

    # the requests the untouched form sends read as the CLI's defaults
    drv.execute_script(RECORD_FETCH)
    for button in ("estimate-btn", "compare-btn", "plan-btn"):
        drv.find_element("id", button).click()
    wait(drv, lambda d: len(d.execute_script("return window.__sent")) >= 3, "the three requests")
    sent = {s["path"]: s["body"] for s in drv.execute_script("return window.__sent")}
    known = (*api.MODEL_FIELDS, "hardware", "devices")
    cases = (
        ("/api/estimate", api.estimate_flags()),
        ("/api/compare", plan_api.plan_flags(True)),
        ("/api/plan", plan_api.plan_flags(False)),
    )
    for path, flags in cases:
        body = sent[path]
        assert api.read_fields(body, flags, known) == api.read_fields({}, flags, known), path
    # a device count is the CLI's: 1 for an estimate, searched (not sent) for compare and plan
    assert inputs.read(sent["/api/estimate"], api.estimate_flags(), also=known)["devices"] == 1
    assert "devices" not in sent["/api/compare"] and "devices" not in sent["/api/plan"]


def test_plan_and_compare_show_the_reasons_and_the_cost(driver: Any, server: TrainplanServer) -> None:
    from trainplan.web import plan_api

    drv = driver
    load(drv, server)
    hardware = ["h100-sxm", "a100-80gb", "gaudi3"]
    check(drv, hardware)
    set_field(drv, "f-tokens", "1e10")
    wait(drv, lambda d: settled(d) and d.find_element("id", "run-time").text != "–", "the run's time")
    set_field(drv, "p-max_devices", "16")
    request = {"model": "llama-3.1-8b", "hardware": hardware, "tokens": 1e10, "max_devices": 16}

    drv.find_element("id", "plan-btn").click()
    wait(drv, lambda d: body_data(d, "plan") == "done", "the plan")
    want = plan_api.plan(request)
    first = want["plans"][0]
    why = drv.find_element("id", "plan-why")
    assert first["label"] in why.find_element("css selector", ".why-head").text
    lines = [li.get_attribute("textContent") for li in why.find_elements("css selector", "ul.why li")]
    binds, alts = first["explanation"]["binds"], first["explanation"]["alternatives"]
    assert lines == [*binds, *(f"vs {a}" for a in alts)]
    assert [li.text for li in why.find_elements("css selector", "ul.notes li")] == want["notes"]
    ranking = [li.text for li in drv.find_elements("css selector", "#plan-ranking li")]
    assert ranking == want["ranking"]
    rows = drv.find_elements("css selector", "#plan-table tbody tr")
    assert len(rows) == len(want["plans"])
    for row, p in zip(rows, want["plans"], strict=True):
        items = row.find_elements("css selector", "td.why-cell ul.why li")
        assert [li.get_attribute("textContent") for li in items][: len(p["explanation"]["binds"])] == (
            p["explanation"]["binds"]
        )

    drv.find_element("id", "compare-btn").click()
    wait(drv, lambda d: body_data(d, "compare") == "done", "the compare")
    got = plan_api.compare({k: v for k, v in request.items() if k != "max_devices"} | {"max_devices": 16})
    heads = [th.text for th in drv.find_elements("css selector", "#compare-table thead th")]
    assert "cost" in heads and "price (provider kind, date)" in heads and "why" in heads
    rows = drv.find_elements("css selector", "#compare-table tbody tr")
    assert len(rows) == len(got["hardware"])
    for row, entry in zip(rows, got["hardware"], strict=True):
        p = entry["plan"]
        cells = row.find_elements("tag name", "td")
        if p is None:
            assert cells[1].text == (entry["reason"] or "no plan")
            continue
        cost = cells[heads.index("cost")].text
        assert cost == f"${round(p['run']['cost_usd']):,}" or cost == f"${p['run']['cost_usd']:.2f}"
        price = cells[heads.index("price (provider kind, date)")].text
        assert p["offering"]["date"] in price and p["offering"]["provider"] in price
        items = row.find_elements("css selector", "td.why-cell ul.why li")
        assert [li.get_attribute("textContent") for li in items][: len(p["explanation"]["binds"])] == (
            p["explanation"]["binds"]
        )
    ranking = [li.text for li in drv.find_elements("css selector", "#compare-ranking li")]
    assert ranking == got["ranking"]
    assert any(
        "uncalibrated" in line for line in ranking
    )  # gaudi3 (no validation rows of Gaudi 3's family band): the note says so
    assert _overlapping(drv.execute_script(SVG_BOXES, "#compare-chart")) == []


SVG_BOXES = """
return [...document.querySelectorAll(arguments[0] + ' svg text')].map((t) => {
  const b = t.getBBox(); return [t.textContent, b.x, b.y, b.width, b.height];
});
"""


def _overlapping(boxes: list[list[Any]]) -> list[tuple[str, str]]:
    out = []
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        for b, bx, by, bw, bh in boxes[i + 1 :]:
            if aw and bw and ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a, b))
    return out


@pytest.mark.parametrize(
    "fields",
    [
        {},  # the default: fits
        {"model": "llama-3.1-70b"},  # far over the device's memory: the limit label moves
        {"f-devices": "8", "f-zero": "3", "f-recompute": "selective", "f-offload": "optimizer"},
        {"f-method": "grpo"},  # an RLHF phase: long, prefixed term names
    ],
    ids=["fits", "over", "zero3-offload", "grpo"],
)
def test_memory_terms_have_distinct_colours_and_labels_that_do_not_overlap(
    driver: Any, server: TrainplanServer, fields: dict[str, str]
) -> None:
    drv = driver
    load(drv, server)

    def shown(d: Any) -> str:
        return str(d.find_element("id", "headline").text + d.find_element("id", "subline").text)

    before = shown(drv)
    for element_id, value in fields.items():
        set_field(drv, element_id, value)
    if fields:
        wait(drv, lambda d: settled(d) and (shown(d) != before or body_data(d, "estimate") == "error"), "it")
    assert body_data(drv, "estimate") == "done", drv.find_element("id", "error").text
    fills = [r.get_attribute("fill") for r in drv.find_elements("css selector", "#memory-chart rect.seg")]
    names = [
        r.get_attribute("data-name") for r in drv.find_elements("css selector", "#memory-chart rect.seg")
    ]
    assert len(fills) >= 3
    assert len(set(fills)) == len(fills), list(zip(names, fills, strict=True))
    assert all(a != b for a, b in itertools.pairwise(fills))
    swatches = drv.find_elements("css selector", "#memory-chart rect.swatch")
    assert [s.get_attribute("fill") for s in swatches] == fills  # the legend names every part
    for chart in ("#memory-chart", "#time-chart"):
        boxes = drv.execute_script(SVG_BOXES, chart)
        assert boxes and _overlapping(boxes) == [], chart


def test_a_bad_upload_marks_the_result_stale(driver: Any, server: TrainplanServer, tmp_path: Path) -> None:
    drv = driver
    load(drv, server)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    drv.find_element("id", "config-file").send_keys(str(bad))
    wait(drv, lambda d: d.find_element("id", "error").is_displayed(), "the upload's error")
    assert drv.find_element("id", "error").text.startswith("config:")
    assert stale(drv, "estimate")
