"""The review site in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven by Selenium.

Nothing is downloaded: Selenium gets the system browser and driver by path. The tests skip, saying what to
install, when either is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

from monai_vce.labels import LABELS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
_MISSING = "headless browser tests need chromium, chromium-driver (apt-get install -y chromium chromium-driver) and selenium (pip install 'monai-vce[test]')"

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select
except ImportError:  # pragma: no cover - depends on the environment
    webdriver = None

pytestmark = pytest.mark.skipif(
    webdriver is None or not (os.path.isfile(CHROMIUM) and os.path.isfile(CHROMEDRIVER)), reason=_MISSING
)

HOSTILE = "</script><script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>\"'&"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    downloads = tmp_path_factory.mktemp("downloads")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tempfile.mkdtemp(prefix='vce-chromium-')}",
        "--window-size=1600,1200",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    # an explicit driver path: Selenium Manager is never asked to fetch anything
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.downloads = downloads
    yield driver
    driver.quit()


def _probs_for(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(0.75 * labels + 0.25 * rng.random(labels.shape), 0, 1).astype(np.float32)


@pytest.fixture(scope="module")
def site(tmp_path_factory, mini_galar):
    """A site of the session's mini-Galar (prediction = ground truth events, reordered) with probabilities,
    plus a video with a hostile id that reuses video 1's frames through the datalist."""
    from monai_vce.data import build_galar_datalist
    from monai_vce.events import Video, save_video_probs
    from monai_vce.metrics import load_events
    from monai_vce.review import write_review_site

    root = tmp_path_factory.mktemp("review_site")
    data = build_galar_datalist(mini_galar / "frames", mini_galar / "labels")
    gt = load_events(mini_galar / "ground_truth.json")
    hostile = [dict(d, video_id=HOSTILE) for d in data if d["video_id"] == "1"]
    rng = np.random.default_rng(0)
    probs_dir = root / "probs"
    for vid in dict.fromkeys(d["video_id"] for d in data):
        items = [d for d in data if d["video_id"] == vid]
        labels = np.asarray([d["label"] for d in items], np.float32)
        idx = np.asarray([d["frame_index"] for d in items])
        num = np.asarray([d["frame_number"] for d in items])
        save_video_probs(probs_dir / f"{vid}.npz", Video(vid, _probs_for(labels, rng), idx, num))
    # most confident first: here simply the ground truth's events reversed, so the order is not the time order
    pred = {"videos": [{"video_id": v["video_id"], "events": v["events"][::-1]} for v in gt["videos"]]}
    index = write_review_site(pred, data, root / "site", probs_dir=probs_dir, gt=gt, frame_rate=5.0, progress=False)
    # an id made of markup (it cannot name a probability file: it holds '/'), its frames through the datalist
    hostile_pred = {"videos": [{"video_id": HOSTILE, "events": pred["videos"][0]["events"]}]}
    hostile_index = write_review_site(hostile_pred, hostile, root / "hostile_site", progress=False)
    return {"index": index, "hostile": hostile_index, "pred": pred, "data": data, "root": root}


def _open(driver, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    deadline = time.time() + 20
    while driver.execute_script("return document.body && document.body.dataset.ready") != "1":
        if time.time() > deadline:
            raise AssertionError("page did not become ready:\n" + "\n".join(map(str, driver.get_log("browser"))))
        time.sleep(0.02)


def _errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def _keys(driver, *keys) -> None:
    chain = ActionChains(driver)
    for k in keys:
        chain.send_keys(k)
    chain.perform()


def _exam_page(site, vid: str) -> Path:
    from monai_vce.review import exam_file_name

    return Path(site["index"]).parent / "exams" / f"{exam_file_name(vid)}.html"


def _state(driver) -> dict:
    return driver.execute_script(
        "var r = window.vceReview; return {sel: r.sel, frame: r.frame, events: r.state.events,"
        " ids: Array.from(r.ids), number: Array.from(r.frameNumber)};"
    )


def test_index_lists_every_exam_without_console_errors(browser, site):
    _open(browser, Path(site["index"]))
    assert _errors(browser) == []
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.exam-row")
    assert [r.get_attribute("data-video") for r in rows] == [v["video_id"] for v in site["pred"]["videos"]]
    rows[0].find_element(By.CSS_SELECTOR, "a.button").click()
    deadline = time.time() + 10
    while browser.execute_script("return document.body.dataset.ready") != "1" and time.time() < deadline:
        time.sleep(0.02)
    assert browser.find_element(By.ID, "exam-title").text == "1"
    assert _errors(browser) == []


def test_keyboard_review_and_exports(browser, site):
    """Keyboard navigation, accept / reject / boundary edits / a new event, exactly reflected in both exports."""
    from monai_vce.data import read_label_csv

    vid = "2"  # frame = 5 * index + offset: events in index units, files named by frame number
    browser.execute_script("window.localStorage.clear()")
    _open(browser, _exam_page(site, vid))
    assert _errors(browser) == []
    events = site["pred"]["videos"][1]["events"]
    assert len(events) >= 4
    st = _state(browser)
    assert st["sel"] == 0  # the most confident event is selected first
    _keys(browser, "j")
    assert _state(browser)["sel"] == 1
    _keys(browser, Keys.ARROW_DOWN, Keys.ARROW_DOWN)
    assert _state(browser)["sel"] == 3
    _keys(browser, "k", Keys.ARROW_UP, Keys.ARROW_UP)
    assert _state(browser)["sel"] == 0
    # the viewer shows the file of the shown frame (frame number, not index)
    st = _state(browser)
    src = browser.find_element(By.ID, "frame-image").get_attribute("src")
    assert src.endswith(f"frame_{st['number'][st['frame']]:06d}.PNG"), src

    _keys(browser, "a")  # accept #1, go on to #2
    assert _state(browser)["sel"] == 1
    _keys(browser, "r")  # reject #2, go on to #3
    st = _state(browser)
    assert st["sel"] == 2 and [e["status"] for e in st["events"][:3]] == ["accepted", "rejected", "pending"]
    # on to the next event of at least 3 frames; move its start one frame later and its end one frame earlier
    p = next(i for i in range(2, len(events)) if st["events"][i]["e"] - st["events"][i]["s"] >= 2)
    _keys(browser, *["j"] * (p - 2))
    assert _state(browser)["sel"] == p
    ev = st["events"][p]
    _keys(browser, Keys.HOME, Keys.ARROW_RIGHT, "[", Keys.END, Keys.ARROW_LEFT, "]")
    st = _state(browser)
    ids = st["ids"]
    new_start, new_end = ids[ev["s"] + 1], ids[ev["e"] - 1]
    assert (st["events"][p]["start"], st["events"][p]["end"]) == (new_start, new_end)
    # a start after the end is refused
    _keys(browser, Keys.END, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, "[")
    assert _state(browser)["events"][p]["start"] == new_start
    # a new polyp event from the shown frame over three frames
    Select(browser.find_element(By.ID, "new-label")).select_by_value("polyp")
    browser.find_element(By.TAG_NAME, "body").click()
    _keys(browser, Keys.HOME, "n", Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, "]")
    st = _state(browser)
    added = st["events"][-1]
    assert added["added"] and added["label"] == ["polyp"] and added["e"] - added["s"] == 2
    # undo takes back the last action (the new event's end), "]" sets it again
    ActionChains(browser).key_down(Keys.CONTROL).send_keys("z").key_up(Keys.CONTROL).perform()
    assert _state(browser)["events"][-1]["e"] == added["s"]
    _keys(browser, "]")
    assert _state(browser)["events"][-1] == added
    counts = browser.find_element(By.ID, "review-counts").text
    assert counts.startswith(f"Reviewed 2 / {len(events)}") and "+ 1 added" in counts

    expected = [dict(events[0])] + [dict(e) for e in events[2:]]
    expected[p - 1] = {**expected[p - 1], "start": new_start, "end": new_end}
    expected.append({"start": added["start"], "end": added["end"], "label": ["polyp"]})
    exported = json.loads(browser.execute_script("return vceReview.exportJSON()"))
    assert exported == {"videos": [{"video_id": vid, "events": expected}]}
    # without the unreviewed events: the accepted one and the added one
    browser.find_element(By.ID, "include-pending").click()
    exported = json.loads(browser.execute_script("return vceReview.exportJSON()"))
    assert exported["videos"][0]["events"] == [expected[0], expected[-1]]
    browser.find_element(By.ID, "include-pending").click()

    # the CSV reads back through the Galar reader, with the same frames and labels as the exported events
    csv_path = site["root"] / "labels" / f"{vid}.csv"
    csv_path.parent.mkdir(exist_ok=True)
    csv_path.write_text(browser.execute_script("return vceReview.exportCSV()"))
    table = read_label_csv(csv_path)
    items = [d for d in site["data"] if d["video_id"] == vid]
    assert table.index.tolist() == [d["frame_index"] for d in items]
    assert table.frame.tolist() == [d["frame_number"] for d in items]
    want = np.zeros((len(items), len(LABELS)), np.float32)
    index = table.index
    for e in expected:
        rows = (index >= e["start"]) & (index <= e["end"])
        for name in e["label"]:
            want[rows, LABELS.index(name)] = 1
    np.testing.assert_array_equal(table.labels, want)

    # the download buttons hand the same content to the browser's downloads
    for f in browser.downloads.iterdir():
        f.unlink()
    browser.find_element(By.ID, "export-json").click()
    target = browser.downloads / f"{vid}_reviewed.json"
    deadline = time.time() + 10
    while not target.is_file() and time.time() < deadline:
        time.sleep(0.05)
    assert json.loads(target.read_text()) == {"videos": [{"video_id": vid, "events": expected}]}

    # a reload keeps every review mark (local storage)
    browser.refresh()
    _open(browser, _exam_page(site, vid))
    assert json.loads(browser.execute_script("return vceReview.exportJSON()"))["videos"][0]["events"] == expected
    assert browser.find_element(By.ID, "review-counts").text == counts
    assert _errors(browser) == []


def test_timeline_click_and_zoom_show_frames(browser, site):
    _open(browser, _exam_page(site, "1"))
    canvas = browser.find_element(By.ID, "timeline")
    browser.execute_script("vceReview.fitView()")
    w = canvas.size["width"]
    # click three quarters along the plot: the viewer jumps there
    plot0, plot_w = 150, browser.execute_script("return vceReview.plotWidth()")
    ActionChains(browser).move_to_element_with_offset(canvas, int(plot0 + 0.75 * plot_w - w / 2), 0).click().perform()
    st = _state(browser)
    n = len(st["ids"])
    assert abs(st["frame"] - 0.75 * n) <= 2
    for _ in range(12):
        _keys(browser, "+")
    view = browser.execute_script("return [vceReview.view.r0, vceReview.view.r1]")
    assert view[1] - view[0] <= plot_w / 40 + 1  # single frames: at least 40 px each
    assert _errors(browser) == []


def test_hostile_video_id_stays_text(browser, site):
    index = Path(site["hostile"])
    for f in index.parent.rglob("*"):
        if f.is_file() and f.suffix in (".html", ".js") and f.parent.name != "assets":
            text = f.read_text()
            assert "<script>window" not in text and "<img src=x" not in text, f
    _open(browser, index)
    assert browser.find_element(By.CSS_SELECTOR, "tr.exam-row a.exam-name").text == HOSTILE
    browser.find_element(By.CSS_SELECTOR, "tr.exam-row a.button").click()
    deadline = time.time() + 20  # wait for the navigation itself, however loaded the machine is
    while "/exams/" not in browser.current_url and time.time() < deadline:
        time.sleep(0.02)
    _open(browser, Path(unquote(urlparse(browser.current_url).path)))  # the file name is percent-encoded in the URL
    assert browser.find_element(By.ID, "exam-title").text == HOSTILE
    assert browser.title == f"VCE review: {HOSTILE}"
    assert browser.execute_script("return window.__pwned") is None
    assert browser.find_elements(By.CSS_SELECTOR, "img[src='x']") == []
    exported = json.loads(browser.execute_script("return vceReview.exportJSON()"))
    assert exported["videos"][0]["video_id"] == HOSTILE
    assert _errors(browser) == []


def test_a_100000_frame_exam_opens_in_under_3_seconds(browser, tmp_path_factory, mini_galar):
    """100,000 frames (hard links to a few PNGs), probabilities and 300 events: the page is ready in < 3 s."""
    from monai_vce.events import Video, save_video_probs
    from monai_vce.review import write_review_site

    n = 100_000
    root = tmp_path_factory.mktemp("long_exam")
    folder = root / "frames" / "long"
    folder.mkdir(parents=True)
    sources = sorted((mini_galar / "frames" / "1").iterdir())[:10]
    for i in range(n):
        os.link(sources[i % len(sources)], folder / f"frame_{i:06d}.PNG")
    rng = np.random.default_rng(0)
    probs = (rng.random((n, len(LABELS))) ** 4).astype(np.float32)
    save_video_probs(root / "probs" / "long.npz", Video("long", probs, np.arange(n), np.arange(n)))
    starts = np.sort(rng.choice(n - 50, 300, replace=False))
    events = [
        {"start": int(s), "end": int(s + rng.integers(1, 40)), "label": [LABELS[int(rng.integers(8, 17))]]}
        for s in starts
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        index = write_review_site(
            {"videos": [{"video_id": "long", "events": events}]},
            root / "frames",
            root / "site",
            probs_dir=root / "probs",
            progress=False,
        )
    thumbs = list((root / "site" / "exams").rglob("thumbs/*.jpg"))
    assert len(thumbs) <= 1500 + 7 * 300  # the site's size is bounded by the strip and the events, not by n
    t0 = time.perf_counter()
    _open(browser, _exam_page({"index": index}, "long"))
    elapsed = time.perf_counter() - t0
    # 3 s on an idle machine; the bound grows with the machine's load (the browser shares the cores)
    limit = 3.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    print(f"100,000-frame exam: page ready {elapsed:.2f} s after navigation (limit {limit:.1f} s)")
    assert elapsed < limit, f"the 100,000-frame exam took {elapsed:.2f} s to open"
    assert browser.execute_script("return vceReview.T") == n
    assert _errors(browser) == []


def test_screening_scores_show_on_the_event_cards(browser, site):
    from monai_vce.review import write_review_site

    events = site["pred"]["videos"][0]["events"]
    scored = [dict(e, score=round(2.0 - 0.5 * k, 2)) for k, e in enumerate(events)]
    pred = {"videos": [{"video_id": site["pred"]["videos"][0]["video_id"], "events": scored}]}
    index = write_review_site(pred, site["data"], site["root"] / "scored_site", probs_dir=site["root"] / "probs",
                              progress=False)  # fmt: skip
    browser.execute_script("window.localStorage.clear()")
    _open(browser, Path(index).parent / "exams" / f"{Path(_exam_page(site, pred['videos'][0]['video_id'])).name}")
    badges = [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".badge.score")]
    assert badges[:2] == ["score 2.00", "score 1.50"] and len(badges) == len(scored)
    assert _errors(browser) == []
    # an unscored site (the challenge events) shows no score badge
    _open(browser, _exam_page(site, pred["videos"][0]["video_id"]))
    assert browser.find_elements(By.CSS_SELECTOR, ".badge.score") == []
