"""The log viewer in a real headless Chromium (Debian's, driven by Playwright).

Screenshots go to test-artifacts/. Skipped, saying why, where Playwright or Chromium is missing:
`pip install playwright` (no `playwright install`: the browser is the system's), `apt-get install
chromium`, or point AGENTTUNE_CHROMIUM at a Chromium/Chrome binary.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from logview_runs import IMG, SCRIPT, logprob, viewer, write_run, write_step

from agenttune.rollout.log import read_records

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
expect = sync_api.expect

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TRAIN_1 = "step 1 · train"


def chromium_path() -> str | None:
    configured = os.environ.get("AGENTTUNE_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:
        configured = os.environ.get("AGENTTUNE_CHROMIUM")
        pytest.skip(f"AGENTTUNE_CHROMIUM={configured} does not exist" if configured else
                    "Chromium is not installed (apt-get install chromium, or set AGENTTUNE_CHROMIUM)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


def new_page(browser, **options):
    page = browser.new_page(viewport={"width": 1600, "height": 950}, **options)
    page.problems = []
    page.on("pageerror", lambda error: page.problems.append(str(error)))
    page.on("console", lambda message: message.type == "error" and page.problems.append(message.text))
    return page


@pytest.fixture
def page(browser):
    page = new_page(browser)
    yield page
    page.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("browser") / "runs" / "arith" / "run-1", steps=2)


@pytest.fixture(scope="module")
def url(run_dir):
    with viewer(run_dir.parents[1]) as (url, _):
        yield url


def open_episode(page, url: str, step: str, index: int) -> None:
    page.goto(url)
    page.get_by_role("button", name=step).click()
    page.locator(f"#episodes tbody tr[data-index='{index}']").click()
    page.wait_for_selector("#episode-header .title")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path


def test_open_a_run_click_a_step_an_episode_and_hover_a_token(page, url, run_dir):
    record = list(read_records(run_dir / "rollouts" / "step_000001_train.jsonl"))[0]
    [sample] = record.samples
    open_episode(page, url, TRAIN_1, 0)
    expect(page.locator(".chart svg")).to_have_count(2, timeout=2_000)  # at once, not at the next poll
    assert page.inner_text("#episode-header .title").startswith(record.task.task_id)
    assert page.locator("#tab-conversation .msg").count() == len(record.messages)
    assert "calculator" in page.inner_text("#tab-conversation .tool-call")

    page.get_by_role("tab", name="Tokens").click()
    assert page.locator(".sample").count() == 1
    tokens = page.locator("#tab-tokens .tok[data-s]")
    assert tokens.count() == len(sample.prompt_ids) + len(sample.response_ids)
    trained = page.locator("#tab-tokens .sample .tok.loss")
    assert trained.count() == sum(sample.loss_mask)
    assert page.locator("#tab-tokens .sample .tok.ctx").count() == sample.loss_mask.count(0)
    colours = {kind: page.eval_on_selector(f"#tab-tokens .sample .tok.{kind}", "el => getComputedStyle(el).backgroundColor")
               for kind in ("loss", "ctx", "prompt")}
    assert colours["loss"] != colours["ctx"] and len(set(colours.values())) == 3

    token = trained.nth(4)
    position = int(token.get_attribute("data-i"))
    token.hover()
    tooltip = page.locator("#tooltip")
    tooltip.wait_for(state="visible")
    expected = logprob(1, 0, position)
    assert sample.logprobs[position] == expected
    assert tooltip.locator("[data-key=logprob] .value").inner_text().startswith(f"{expected:.4f}")
    assert tooltip.locator("[data-key=id] .value").inner_text() == str(sample.response_ids[position])
    assert tooltip.locator("[data-key=text] .value").inner_text() == json.dumps(sample.response_tokens[position])
    assert "trained" in tooltip.locator("[data-key=kind] .value").inner_text()
    assert tooltip.locator("[data-key='policy version'] .value").inner_text() == str(sample.policy_versions[position])
    screenshot(page, "logview-tokens.png")
    last = trained.last  # sampled after the weight update between the calls
    last.hover()
    expect(tooltip.locator("[data-key='policy version'] .value")).to_have_text(
        str(sample.policy_versions[int(last.get_attribute("data-i"))]))
    assert sample.policy_versions[int(last.get_attribute("data-i"))] != sample.policy_versions[position]

    context = page.locator("#tab-tokens .sample .tok.ctx").first
    context.hover()
    expect(tooltip.locator("[data-key=kind] .value")).to_contain_text("context")
    assert "not sampled" in tooltip.locator("[data-key=logprob] .value").inner_text()
    assert tooltip.locator("[data-key='policy version']").count() == 0
    assert page.problems == []


@pytest.mark.parametrize("csp", [True, False], ids=["with-csp", "without-csp"])
def test_model_text_is_shown_as_text_and_never_runs(browser, url, csp):
    """Model text never runs, also where the Content-Security-Policy is not enforced: it is never HTML."""
    page = new_page(browser, bypass_csp=not csp)
    open_episode(page, url, TRAIN_1, 5)
    answer = page.locator("#tab-conversation .msg.assistant .msg-body").last.inner_text()
    assert SCRIPT in answer and IMG in answer
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#detail img, #detail script").count() == 0
    assert page.locator("script").count() == 1  # app.js
    page.get_by_role("tab", name="Tokens").click()
    assert "<script>" in page.inner_text("#tab-tokens .sample")
    assert page.evaluate("window.__pwned") is None
    screenshot(page, f"logview-escaping-{'csp' if csp else 'no-csp'}.png")
    page.close()


def test_the_page_refuses_inline_scripts(page, url):
    page.goto(url)
    with pytest.raises(sync_api.Error):
        page.add_script_tag(content="window.__inline = 1")  # what an injected <script> would be
    assert page.evaluate("window.__inline") is None


def test_filter_search_and_sort_the_episode_table(page, url):
    page.goto(url)
    page.get_by_role("button", name=TRAIN_1).click()
    rows = page.locator("#episodes tbody tr[data-index]")
    rows.first.wait_for()
    assert rows.count() == 6
    page.fill("#search", "What is 4 * 7")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-index") == "4"
    page.fill("#search", "")
    expect(rows).to_have_count(6)
    page.select_option("#status-filter", "timeout")
    expect(rows).to_have_count(1)
    assert "timeout" in rows.first.inner_text()
    page.select_option("#status-filter", "")
    page.fill("#min-reward", "1")
    page.press("#min-reward", "Enter")
    expect(rows).to_have_count(3)
    page.fill("#min-reward", "")
    page.press("#min-reward", "Enter")
    expect(rows).to_have_count(6)
    reward_header = page.locator("#episodes th[data-sort=reward]")
    reward_header.click()
    reward_header.click()
    page.wait_for_selector("#episodes th.sorted-desc[data-sort=reward]")
    expect(page.locator("#episodes tbody td:nth-child(5)").first).to_have_text("1")
    rewards = [float(text) for text in page.locator("#episodes tbody td:nth-child(5)").all_inner_texts()]
    assert rewards == sorted(rewards, reverse=True)
    assert page.problems == []


def test_charts_and_steps_update_while_training_runs(page, tmp_path):
    run = write_run(tmp_path / "live-run", steps=1)
    with viewer(run) as (url, _):
        page.goto(url)
        page.wait_for_selector(".chart svg")
        points = page.locator(".chart[data-title='Success / accuracy'] circle")
        assert points.count() == 2  # train success and validation accuracy at step 1
        write_step(run, 2)  # the next step lands while the page is open
        expect(points).to_have_count(4, timeout=15_000)
        page.get_by_role("button", name="step 2 · validation").wait_for(timeout=15_000)
        legend = page.inner_text(".chart[data-title='Success / accuracy'] .legend")
        assert "validation accuracy 50.0%" in legend
        screenshot(page, "logview-live.png")
        assert page.problems == []


def test_a_step_with_thousands_of_episodes_opens_a_page_at_a_time(page, tmp_path):
    run = write_run(tmp_path / "big-run", steps=1, validation=False)
    path = run / "rollouts" / "step_000001_train.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines * 400))  # 2,400 episodes
    with viewer(run) as (url, _):
        page.goto(url)
        page.get_by_role("button", name=TRAIN_1).click()
        expect(page.locator("#page-info")).to_have_text("1–100 of 2,400")
        assert page.locator("#episodes tbody tr[data-index]").count() == 100
        page.click("#next")
        expect(page.locator("#page-info")).to_have_text("101–200 of 2,400")
        page.locator("#episodes tbody tr[data-index='150']").click()
        page.wait_for_selector("#episode-header .title")
        assert page.inner_text("#episode-header .title").startswith("arith-0")  # line 150 = episode 0 again
        assert page.problems == []
