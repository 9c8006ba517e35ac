"""report.html in a real headless Chromium: hovering a point of a curve reads the value metrics.jsonl holds;
a click on a run in the legend hides it on every panel."""

import json

import pytest

from pretrain.report import make_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, slope in (("run-a", 0.20), ("run-b", 0.15)):
        (root / name).mkdir()
        lines = [
            {
                "step": s,
                "tokens": 4096 * s,
                "loss": 10.0 - slope * s,
                "lr": 1e-4,
                "batch_tokens": 4096,
                "grad_norm": 1.0,
                "tokens_per_s": 1000.0 + s,
                "mfu": None,
                "peak_mem_bytes": None,
            }
            for s in range(1, 21)
        ]
        lines.append({"step": 20, "tokens": 4096 * 20, "eval/hellaswag": 0.3})
        (root / name / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    make_report([root / "run-a", root / "run-b"], root / "report")
    return root / "report" / "report.html"


def test_hover_reads_a_points_value(browser, wait, report):
    from selenium.webdriver.common.action_chains import ActionChains

    browser.get(report.as_uri())
    wait("!!(document.getElementById('curves') && document.getElementById('curves')._fullLayout)")
    # where run-b's loss at step 12 is drawn: plotly's own axis conversions, in the window's pixels
    x, y = browser.execute_script("""
        const gd = document.getElementById('curves'), box = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        return [box.left + xa._offset + xa.l2p(xa.c2l(4096 * 12)),
                box.top + ya._offset + ya.l2p(ya.c2l(10 - 0.15 * 12))];
    """)
    actions = ActionChains(browser)
    actions.w3c_actions.pointer_action.move_to_location(int(x), int(y))
    actions.perform()
    text = wait(
        "document.querySelector('#curves .hoverlayer .hovertext') && "
        "document.querySelector('#curves .hoverlayer').textContent"
    )
    assert text == "run-bloss 8.2step 12, tokens 49,152"  # the label's lines, as textContent joins them

    hidden = (
        "document.getElementById('curves').data.filter(t => t.legendgroup === 'run-a' "
        "&& t.visible === 'legendonly').length"
    )
    assert browser.execute_script(f"return {hidden}") == 0
    browser.find_element("css selector", "#curves .legend .traces").click()  # the first entry: run-a
    # every one of run-a's curves (7 panels with data or not, and the eval/hellaswag panel) is hidden
    assert (
        wait(hidden)
        == browser.execute_script(
            "return document.getElementById('curves').data.filter(t => t.legendgroup === 'run-a').length"
        )
        > 5
    )
