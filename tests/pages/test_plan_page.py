"""`pretrain plan --serve` in a real headless Chromium: inputs change the URL, and the table and chart show
the numbers of `pretrain plan --json` for that URL's overrides; bad input is an inline line, no traceback."""

import json
from urllib.parse import parse_qsl, urlsplit

import pytest

from support import run_cli, serve_planner

START = ("model.preset=llama3-8b", "parallel.gpus=64", "hardware.gpu=h100-sxm")
GiB = 2**30


@pytest.fixture(scope="module")
def page(browser, wait):
    proc, url = serve_planner(*START)
    browser.get(url)
    wait("document.body.dataset.planned === location.search.slice(1)")
    yield browser
    proc.terminate()
    proc.wait(10)


def planned(page, wait) -> list[str]:
    """The overrides on the page once its plan has arrived: the URL's query."""
    wait("document.body.dataset.planned === location.search.slice(1)")
    return [f"{k}={v}" for k, v in parse_qsl(urlsplit(page.current_url).query)]


def by_path(plan: dict, path: str):
    for key in path.split("."):
        plan = plan[key]
    return plan


def test_gpus_and_zero_stage_update_the_url_table_and_chart(page, wait):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    gpus = page.find_element(By.CSS_SELECTOR, '[data-key="parallel.gpus"]')
    gpus.clear()
    gpus.send_keys("128")
    Select(page.find_element(By.CSS_SELECTOR, '[data-key="parallel.zero_stage"]')).select_by_visible_text("3")
    wait("location.search.includes('zero_stage=3') && location.search.includes('gpus=128')")
    items = planned(page, wait)
    assert items == ["model.preset=llama3-8b", "hardware.gpu=h100-sxm", "parallel.gpus=128", "parallel.zero_stage=3"]
    r = run_cli("plan", *items, "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)

    cells = page.execute_script(
        "return [...document.querySelectorAll('#plan td[data-key]')]"
        ".map(td => [td.dataset.key, td.dataset.value, td.textContent])"
    )
    assert len(cells) >= 12
    for key, value, _ in cells:
        if key != "budget":
            expected = by_path(plan, key)
            assert value == (
                "" if expected is None else str(expected).lower() if isinstance(expected, bool) else str(expected)
            ) or float(value) == pytest.approx(expected, rel=1e-12), key
    shown = {key: text for key, _, text in cells}
    mem = plan["memory_bytes"]
    assert shown["memory_bytes.total"] == f"{mem['total'] / GiB:.2f} in {mem['peak_phase']}"
    assert shown["parallel.world"] == "128 (128 x 1 x 1), ZeRO-3"
    assert shown["fits"] == ("yes" if plan["fits"] else "no")

    # the chart: one stacked bar per phase, whose parts sum to the plan's phases; the usable line
    bars = page.execute_script("return document.getElementById('chart').data.map(t => [t.x, t.y])")
    totals = {phase: sum(y[i] for x, y in bars for i in range(len(x)) if x[i] == phase) for phase in mem["phases"]}
    assert totals == pytest.approx({k: v / GiB for k, v in mem["phases"].items()}, rel=1e-9)
    usable = page.execute_script("return document.getElementById('chart').layout.shapes[0].y0")
    assert usable == pytest.approx(plan["usable_memory_bytes"] / GiB)
    advice = page.execute_script("return [...document.querySelectorAll('#advice p')].map(p => p.textContent)")
    assert advice == [f"! {a}" for a in plan["advice"]]


def test_fit_row_applies_and_command_shows_the_cli(page, wait):
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "run-fit").click()
    wait("document.querySelector('[data-apply=\"0\"]')", timeout=120)
    row = page.execute_script("return document.querySelector('#fit-table tr:nth-child(2) td').textContent")
    page.find_element(By.CSS_SELECTOR, '[data-apply="0"]').click()
    wait("!document.querySelector('[data-apply]')")  # applying re-plans and clears the ranking
    items = planned(page, wait)
    assert set(row.split()) <= set(items)  # every change of the row is now in the URL
    page.find_element(By.ID, "show-command").click()
    wait("document.getElementById('cli')")
    assert page.find_element(By.ID, "cli").text == " ".join(["pretrain plan", *items])


def test_a_moe_model_shows_its_active_parameters_and_expert_degree(page, wait):
    # The table showed neither for a Mixture-of-Experts model; a dense one has no such rows.
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    keys = lambda: page.execute_script(  # noqa: E731
        "return Object.fromEntries([...document.querySelectorAll('#plan td[data-key]')]"
        ".map(td => [td.dataset.key, [td.dataset.value, td.textContent]]))"
    )
    assert "params.active" not in keys() and "parallel.expert" not in keys()  # llama3-8b
    Select(page.find_element(By.ID, "preset")).select_by_visible_text("qwen3-30b-a3b")
    expert = page.find_element(By.CSS_SELECTOR, '[data-key="parallel.expert"]')
    expert.clear()
    expert.send_keys("8")
    wait("location.search.includes('expert=8') && location.search.includes('qwen3-30b-a3b')")
    items = planned(page, wait)
    plan = json.loads(run_cli("plan", *items, "--json").stdout)
    shown = keys()
    assert (
        shown["params.active"][0] == str(plan["params"]["active"])
        and "8 of 128 routed experts" in shown["params.active"][1]
    )
    assert shown["parallel.expert"] == ["8", "8: 16 of 128 experts per GPU"]


def test_bad_input_is_an_inline_line(page, wait):
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "hf").send_keys('{"model_type": "llama", "hidden_size": ')
    page.find_element(By.ID, "use-hf").click()
    text = wait("document.getElementById('hf-error').textContent")
    assert text.startswith("the pasted config.json is not valid JSON") and "\n" not in text
    other = page.find_element(By.ID, "other")
    other.send_keys("\nparallel.zero_stage=5")  # below the keys the applied --fit row set
    text = wait("document.getElementById('error').textContent")
    r = run_cli("plan", "parallel.zero_stage=5")
    assert r.stderr == f"pretrain plan: error: {text}\n"
    assert "Traceback" not in page.page_source
