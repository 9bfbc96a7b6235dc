"""How fast the log viewer opens a big step, next to the obvious way of reading one.

Writes one step of N episodes (prompt + response tokens each, with token text) with the real
`RolloutLog` writer, starts the real viewer on loopback, and times, side by side in one run:

    full parse     json.loads of every line to build the episode table (what a simple viewer does)
    first open     GET /api/episodes on a file never opened (builds the byte-offset index) + 1st page
    next page      GET /api/episodes again (index cached; a filter/sort/page change costs this)
    search         GET /api/episodes?q=... (scans the records' text, token arrays skipped)
    one episode    GET /api/episode (the full record of one trajectory, sent as written)
    browser        load the page in headless Chromium until the step's first row shows (a first
                   open too; if Playwright and Chromium are installed, --no-browser skips it)

    python bench/logview_open_step.py                       # 2,000 episodes x 2,500 tokens
    python bench/logview_open_step.py --episodes 5000 --tokens 1000

Target: a step with thousands of episodes opens in about a second (first open, and browser).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from agenttune.logview.server import start_in_background
from agenttune.rollout.log import RolloutLog
from agenttune.workflow.episode import Episode, Sample
from agenttune.workflow.task import Task


class Vocabulary:
    """A decoder with a few thousand distinct token texts (the tiny tokenizer has too few)."""

    def decode(self, token_ids: list[int], **_: object) -> str:
        return "".join(f" w{token_id}" for token_id in token_ids)


def episodes(count: int, tokens: int, seed: int = 0) -> list[Episode]:
    rng = random.Random(seed)
    prompt_length = tokens // 5
    made = []
    for number in range(count):
        response = [rng.randrange(30_000) for _ in range(tokens - prompt_length)]
        mask = [int(rng.random() < 0.6) for _ in response]
        sample = Sample(prompt_ids=[rng.randrange(30_000) for _ in range(prompt_length)], response_ids=response,
                        loss_mask=mask, logprobs=[-round(rng.random() * 3, 4) if m else 0.0 for m in mask])
        text = " ".join(f"word{rng.randrange(5000)}" for _ in range(tokens // 4))
        made.append(Episode(
            episode_id=f"episode-{number}", task=Task(task_id=f"task-{number // 8}", query=f"Question {number}?"),
            group_id=f"group-{number // 8}", repeat_index=number % 8, reward=rng.random(), success=rng.random() < 0.5,
            samples=[sample], messages=[{"role": "user", "content": f"Question {number}?"},
                                        {"role": "assistant", "content": text}],
            metrics={"calls": float(rng.randrange(1, 6))}, duration_s=rng.random() * 30))
    return made


def timed(function, repeats: int = 1) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def full_parse(path: Path) -> int:
    with path.open("rb") as file:
        rows = [json.loads(line)["reward"] for line in file if line.strip()]
    return len(rows)


def browser_open(url: str) -> float | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    executable = os.environ.get("AGENTTUNE_CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
    if not executable:
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url + "static/app.css")  # warm the browser up: its first navigation is slow by itself
        started = time.perf_counter()
        page.goto(url)  # a single run: the page opens its latest train step by itself
        page.locator("#episodes tbody tr[data-index='0']").wait_for(timeout=60_000)
        elapsed = time.perf_counter() - started
        browser.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=2500, help="tokens per episode (prompt + response)")
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="logview-bench-") as directory:
        run = Path(directory) / "run"
        started = time.perf_counter()
        # Written in chunks: the writer appends, and a whole step of Episode objects is a lot of memory.
        for chunk in range(0, args.episodes, 250):
            batch = episodes(min(250, args.episodes - chunk), args.tokens, seed=chunk)
            RolloutLog(run / "rollouts").write(1, "train", batch, Vocabulary())
        path = run / "rollouts" / "step_000001_train.jsonl"
        size_mb = path.stat().st_size / 1e6
        print(f"step: {args.episodes:,} episodes x {args.tokens:,} tokens = {size_mb:,.0f} MB "
              f"(written in {time.perf_counter() - started:.1f} s)")

        baseline = timed(lambda: full_parse(path))
        viewer = start_in_background(run, port=0)
        file_id = "rollouts/step_000001_train.jsonl"
        try:
            with httpx.Client(base_url=viewer.url, timeout=120) as client:
                def page(**params):
                    response = client.get("/api/episodes", params={"file": file_id, **params})
                    response.raise_for_status()
                    return response.json()

                first = timed(page)
                assert page()["total"] == args.episodes
                warm = timed(lambda: page(sort="reward", order="desc", offset=500), repeats=5)
                search = timed(lambda: page(q="word4242"), repeats=3)
                one = timed(lambda: client.get("/api/episode", params={"file": file_id, "index": 1234 % args.episodes})
                            .raise_for_status(), repeats=5)
            # A fresh viewer, so the browser's view is a first open too.
            viewer.stop()
            viewer = start_in_background(run, port=0)
            clicked = None if args.no_browser else browser_open(viewer.url)
        finally:
            viewer.stop()

    print(f"{'full parse (baseline)':<24}{baseline * 1000:>10.0f} ms")
    print(f"{'first open (index)':<24}{first * 1000:>10.0f} ms   {baseline / first:5.1f}x faster than the full parse")
    print(f"{'next page (sorted)':<24}{warm * 1000:>10.1f} ms")
    print(f"{'search':<24}{search * 1000:>10.0f} ms")
    print(f"{'one episode':<24}{one * 1000:>10.1f} ms")
    if clicked is not None:
        print(f"{'browser: load to rows':<24}{clicked * 1000:>10.0f} ms   (page load + first open, headless Chromium)")
    else:
        print("browser: skipped (no Playwright or Chromium, or --no-browser)")


if __name__ == "__main__":
    main()
