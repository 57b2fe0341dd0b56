"""The lessons as a student sees them: JupyterLab in headless Chromium runs every lesson top to
bottom (Run → Run All Cells), then checks that no cell shows an error, that every plotly figure
the kernel sent is drawn, that widgets are drawn, and that moving a slider redraws its figure.

One JupyterLab, rooted as `make lab` roots it (a temporary copy of lessons/ and labs/ side by
side, so no output lands in the repository; the Makefile's LAB_MAP opens the lesson map first),
and one browser serve the whole module. A lab's playground runs there too. A full-page
screenshot of each lesson goes to build/browser/<lesson>.png. Chromium comes from Debian
(`make browser`); without it this skips.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat
import psutil
import pytest
from chromium import CHROMIUM, CHROMIUM_FLAGS, MISSING

if TYPE_CHECKING:
    from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
PLAYGROUND = sorted((ROOT / "labs").glob("*/playground.ipynb"))[0].relative_to(ROOT).as_posix()
# `make lab`'s own JupyterLab options (the lesson map first), read from the Makefile.
LAB_MAP = re.search(r"^LAB_MAP\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(),
                    re.M).group(1).split()
SHOTS = ROOT / "build" / "browser"
# A full-page screenshot of every lesson (build/browser/*.png) when BROWSER_SHOTS=1 is set; a
# failing lesson is always shot. Growing the window to a long notebook's height and encoding
# the PNG took seconds per lesson on 2 cores, which the suite need not pay on a pass.
SCREENSHOTS = os.environ.get("BROWSER_SHOTS") == "1"
START_S = 240              # JupyterLab or a kernel starting on a loaded laptop (as nbval's wait)
LESSON_TIMEOUT_S = 180.0   # Run All Cells to the last cell, per lesson
SLIDER_TIMEOUT_S = 30.0    # a slider's redraw runs ranks again: about a second
SLIDERS = re.compile(r"\b(IntSlider|FloatSlider|FloatLogSlider|SelectionSlider)\b")
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# One JupyterLab and one Chromium for the module: under `make test` (pytest-xdist) the whole
# file runs on one worker (conftest.py's ONE_WORKER_FILES), so they start once.
pytestmark = [pytest.mark.browser, pytest.mark.slow]
if not CHROMIUM.exists():
    pytest.skip(MISSING, allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]'")


@dataclass
class Lab:
    """A running JupyterLab: where it answers and where its notebooks live."""
    base: str
    token: str
    root: Path

    def url(self, path: str) -> str:
        return f"{self.base}/{path}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(f"{self.base}/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None


def kill_tree(proc: subprocess.Popen) -> None:
    """End a process and everything it started (kernels, their ranks), gently first."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)
    proc.wait(timeout=5)


def fresh_copy(src: Path, dst: Path) -> None:
    """Copy notebooks without outputs, so counts and figures on screen come from this run."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for path in dst.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    fresh_copy(LESSONS, tmp / "root" / "lessons")
    fresh_copy(ROOT / "labs", tmp / "root" / "labs")
    # Binder's settings (Markdown opens rendered, no news pop-up), as an app-level override...
    (tmp / "app-settings").mkdir()
    shutil.copy(ROOT / "binder" / "overrides.json", tmp / "app-settings" / "overrides.json")
    # ...and one for the test: every cell in the DOM (no windowing), for counts and screenshots.
    tracker = tmp / "user-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    token = secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", "--port=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'root'}",
           f"--LabApp.app_settings_dir={tmp / 'app-settings'}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *LAB_MAP]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "user-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    log = tmp / "lab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # --port=0 lets the OS pick a free port; the server writes the one it got here.
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and server.poll() is None:
            try:
                info = json.loads(next((tmp / "runtime").glob("jpserver-*.json")).read_text())
                lab = Lab(f"http://127.0.0.1:{info['port']}", token, tmp / "root")
                lab.api("api/status")
                break
            except (StopIteration, ValueError, OSError):  # not written (fully) yet, not answering
                pass
            time.sleep(0.2)
        else:
            pytest.fail(f"JupyterLab did not answer within {START_S} s:\n{log.read_text()[-3000:]}")
        yield lab
    finally:
        kill_tree(server)


@pytest.fixture(scope="module")
def page(lab: Lab) -> Iterator[Page]:
    pw = sync_api.sync_playwright().start()  # its driver, and Chromium under it, end with stop()
    browser = None
    try:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(60_000)
        page.on("dialog", lambda d: d.accept())  # "leave with unsaved changes?" on a failed lesson
        # Open a page of the server now: Chromium starts its renderer processes here, not inside
        # a test, where tests/conftest.py would count them as left behind.
        page.goto(lab.url("api"))
        yield page
    finally:
        if browser is not None:
            browser.close()
        pw.stop()


def open_in_lab(page: Page, lab: Lab, name: str) -> None:
    """Open a file in its own fresh workspace (no tabs restored from an earlier test)."""
    page.goto(lab.url(f"lab/workspaces/{Path(name).stem}/tree/{name}"))
    page.wait_for_selector(".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-Toolbar")
    # Collapse the file browser: the notebook gets the whole width in the screenshot.
    open_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if open_tab.count():
        open_tab.click()


def close_lesson(page: Page, lab: Lab) -> None:
    page.goto(lab.url("api"))
    for session in lab.api("api/sessions"):  # shuts its kernel down; its ranks end with it
        lab.api(f"api/sessions/{session['id']}", method="DELETE")


PROMPTS_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
  .map(c => c.querySelector('.jp-InputArea-prompt').textContent.trim())"""


def kernel_state(lab: Lab) -> str | None:
    """The notebook kernel's execution state; None while there is none yet. jupyter_server
    answers 500 to /api/kernels while a kernel is still starting (its last_activity not set
    yet): that is "not ready", and the callers poll again within their deadline."""
    try:
        kernels = lab.api("api/kernels")
    except urllib.error.HTTPError as err:
        if err.code == 500:
            return None
        raise
    return kernels[0]["execution_state"] if kernels else None


def run_all_cells(page: Page, lab: Lab) -> list[str]:
    """Run → Run All Cells, as the lesson tells the student; returns the prompts at the end."""
    deadline = time.monotonic() + START_S
    while kernel_state(lab) != "idle":  # the notebook's kernel has started and is ready
        assert time.monotonic() < deadline, \
            f"no kernel within {START_S} s (does the notebook name one?)"
        time.sleep(0.2)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
    deadline = time.monotonic() + LESSON_TIMEOUT_S
    while True:  # done: nothing queued ([*]) and the kernel idle; an error stops Run All early
        prompts = page.evaluate(PROMPTS_JS)
        if ("[*]:" not in prompts and any(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
                and kernel_state(lab) == "idle"):
            return prompts
        assert time.monotonic() < deadline, f"not done after {LESSON_TIMEOUT_S:.0f} s: {prompts}"
        time.sleep(0.5)


def save_and_read(page: Page, lab: Lab, name: str) -> nbformat.NotebookNode:
    """Save (Ctrl+S) and read back what the kernel sent: the truth the page is checked against."""
    page.keyboard.press("Control+s")
    page.wait_for_selector(".lm-TabBar-tab.jp-mod-dirty", state="detached", timeout=30_000)
    return nbformat.read(lab.root / name, as_version=4)


def error_outputs(nb: nbformat.NotebookNode) -> list[str]:
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    return [f"cell [{c.execution_count}]:\n" + ansi.sub("", "\n".join(o.traceback))
            for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"]


def count_outputs(nb: nbformat.NotebookNode, mime: str) -> int:
    return sum(mime in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)


# Figures actually drawn: plotly put an SVG of a real size in the div.
FIGURES_JS = """() => [...document.querySelectorAll('.jp-Notebook .js-plotly-plot')]
  .filter(e => e.querySelector('.main-svg')?.getBoundingClientRect().width > 100).length"""
# Every figure in the slider's cell and the next one, as plotly holds it (data and layout).
SIGNATURE_JS = """(i) => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].slice(i, i + 2);
  const plots = cells.flatMap(c => [...c.querySelectorAll('.js-plotly-plot')]);
  return JSON.stringify(plots.map(e => [e.data, e.layout])); }"""
SLIDER_CELL_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].findIndex(
  (c, i, all) => c.querySelector('.widget-slider .noUi-handle')
    && (c.querySelector('.js-plotly-plot') || all[i + 1]?.querySelector('.js-plotly-plot')))"""


def move_a_slider(page: Page) -> None:
    """One arrow key on the first slider beside a figure; that figure must be redrawn."""
    cell = page.evaluate(SLIDER_CELL_JS)
    assert cell >= 0, "no slider with a figure in its cell or the next one"
    before = page.evaluate(SIGNATURE_JS, cell)
    handle = page.locator(".jp-Notebook .jp-CodeCell").nth(cell).locator(".noUi-handle").first
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    handle.focus()
    page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
    try:
        page.wait_for_function(f"(before) => ({SIGNATURE_JS})({cell}) !== before", arg=before,
                               timeout=SLIDER_TIMEOUT_S * 1000)
    except sync_api.TimeoutError:
        pytest.fail(f"moved the slider in code cell {cell + 1} to "
                    f"{handle.get_attribute('aria-valuetext')}; its figure did not change within "
                    f"{SLIDER_TIMEOUT_S:.0f} s (a display_id update from a widget callback never "
                    f"reaches JupyterLab: draw into an ipywidgets.Output instead)")


NOTEBOOK_SCROLLER = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"


def full_page_screenshot(page: Page, path: Path) -> None:
    """JupyterLab scrolls inside the notebook: grow the window to the notebook's height first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = page.evaluate(f"""() => {{ const s = document.querySelector('{NOTEBOOK_SCROLLER}');
        return s ? s.scrollHeight - s.clientHeight : 0; }}""")
    page.set_viewport_size({"width": 1280, "height": min(900 + extra, 32_000)})  # Chromium's limit
    page.evaluate(f"() => document.querySelector('{NOTEBOOK_SCROLLER}')?.scrollTo(0, 0)")
    page.wait_for_timeout(500)  # let plotly re-lay out to the new size
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_make_lab_opens_the_lesson_map_at_the_repository_root(lab: Lab, page: Page) -> None:
    """`make lab`'s URL (the server's root) lands on the rendered map; labs/ is in reach."""
    try:
        page.goto(f"{lab.base}/?token={lab.token}")
        page.wait_for_selector(".jp-RenderedMarkdown h1")
        assert page.url.split("?")[0].endswith("/lab/tree/lessons/README.md"), page.url
        assert page.inner_text(".jp-RenderedMarkdown h1").startswith("Lesson map")
        top = {item["name"] for item in lab.api("api/contents")["content"]}
        assert {"lessons", "labs"} <= top, f"the lab's root holds {sorted(top)}"
    finally:
        close_lesson(page, lab)


def test_binder_landing_page_links_every_lesson(lab: Lab, page: Page) -> None:
    """Binder opens lessons/README.md (binder/overrides.json renders it): a link per lesson."""
    try:
        open_in_lab(page, lab, "lessons/README.md")
        page.wait_for_selector(".jp-RenderedMarkdown h1")
        hrefs = page.eval_on_selector_all(".jp-RenderedMarkdown a", "els => els.map(e => e.href)")
        missing = [p.name for p in LESSONS.glob("*.ipynb") if not any(p.name in h for h in hrefs)]
        assert not missing, f"lessons/README.md does not link {missing}"
    finally:
        close_lesson(page, lab)


@pytest.mark.parametrize("lesson", sorted(LESSONS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_lesson_runs_and_draws_in_a_browser(lab: Lab, page: Page, lesson: Path) -> None:
    source = "\n".join(c.source for c in nbformat.read(lesson, as_version=4).cells
                       if c.cell_type == "code")
    shot = SHOTS / f"{lesson.stem}.png"
    start, passed = time.monotonic(), False
    try:
        open_in_lab(page, lab, f"lessons/{lesson.name}")
        prompts = run_all_cells(page, lab)
        nb = save_and_read(page, lab, f"lessons/{lesson.name}")
        errors = error_outputs(nb)
        assert not errors, "\n\n".join(errors)
        assert all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), f"cells did not run: {prompts}"
        unrendered = page.locator(".jp-Notebook").get_by_text("No renderer could be found")
        assert not unrendered.count(), unrendered.first.inner_text()  # a missing labextension

        sent = count_outputs(nb, PLOTLY_MIME)
        wanted = max(sent, 1 if re.search(r"\bplotly\b|\bviz\.", source) else 0)
        if wanted:
            page.wait_for_function(f"() => ({FIGURES_JS})() >= {wanted}", timeout=20_000)
        if "ipywidgets" in source or count_outputs(nb, WIDGET_MIME):
            page.wait_for_selector(".jp-Notebook .jupyter-widgets", timeout=20_000)
            assert not page.locator(".jp-Notebook").get_by_text("Error displaying widget").count()
        if SLIDERS.search(source) or page.locator(".jp-Notebook .widget-slider").count():
            move_a_slider(page)
        passed = True
    finally:
        try:
            ran = time.monotonic() - start
            if not passed or SCREENSHOTS:
                full_page_screenshot(page, shot)
                print(f"\n{lesson.name}: {ran:.1f} s in the browser; screenshot "
                      f"{shot.relative_to(ROOT)} ({time.monotonic() - start - ran:.1f} s)")
        finally:
            close_lesson(page, lab)


def test_a_labs_playground_runs_from_the_same_lab(lab: Lab, page: Page) -> None:
    """From the lesson map's JupyterLab, a lab's playground opens and runs top to bottom: its
    kernel starts in the lab's folder, so `import <the student's module>` finds it."""
    shot = SHOTS / f"{Path(PLAYGROUND).parent.name}-playground.png"
    try:
        open_in_lab(page, lab, PLAYGROUND)
        prompts = run_all_cells(page, lab)
        nb = save_and_read(page, lab, PLAYGROUND)
        errors = error_outputs(nb)
        assert not errors, "\n\n".join(errors)
        assert prompts and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts), prompts
    finally:
        try:
            full_page_screenshot(page, shot)
        finally:
            close_lesson(page, lab)
