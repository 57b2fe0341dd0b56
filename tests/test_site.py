"""The course website (website/site_build.py, `make site`): which pages it takes, how it draws
MyST's AST, and one real build browsed in Chromium.

The full build executes every lesson (minutes: the README gives the figure); the suite already
runs every lesson twice (nbval, tests/test_browser.py), so the build here executes one lesson,
the fastest with a plotly figure by the map's measured run time, and shows the others as stored.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
from chromium import CHROMIUM, CHROMIUM_FLAGS, MISSING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "website"))
import site_build as build  # noqa: E402  (website/site_build.py)
import site_render as render  # noqa: E402

from toolkit.hub import lesson_resources  # noqa: E402


# -- which pages, in which order ----------------------------------------------------------------
def test_pages_follow_the_map_and_take_every_lesson_on_disk() -> None:
    pages = build.course_pages()
    on_disk = sorted(f"lessons/{p.name}" for p in (ROOT / "lessons").glob("*.ipynb"))
    assert pages.landing == "lessons/README.md"
    assert sorted(pages.lessons) == on_disk and len(set(pages.lessons)) == len(pages.lessons)
    in_map = [f"lessons/{r.notebook}" for r in lesson_resources(
        (ROOT / "lessons" / "README.md").read_text())]
    assert [p for p in pages.lessons if p in in_map] == in_map   # the map's reading order
    assert pages.labs[0] == "labs/README.md"
    assert set(pages.labs[1:]) == {f"labs/{p.parent.name}/README.md"
                                   for p in (ROOT / "labs").glob("*/README.md")}
    assert set(pages.docs) == {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}


def test_a_lesson_not_in_the_map_yet_is_appended(tmp_path: Path) -> None:
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "README.md").write_text(
        "| 03 | [`03_b.ipynb`](03_b.ipynb): b |\n| 01 | [`01_a.ipynb`](01_a.ipynb): a |\n")
    for name in ("01_a", "03_b", "02_new", "05_newer"):
        (tmp_path / "lessons" / f"{name}.ipynb").write_text("{}")
    got = build.course_pages(tmp_path)
    assert got.lessons == ["lessons/03_b.ipynb", "lessons/01_a.ipynb", "lessons/02_new.ipynb",
                           "lessons/05_newer.ipynb"]
    assert got.labs == [] and got.docs == []


def test_execute_names_a_subset_or_says_what_exists() -> None:
    lessons = ["lessons/00_a.ipynb", "lessons/08_b.ipynb"]
    assert build.selected(lessons, "all") == lessons and build.selected(lessons, "none") == []
    assert build.selected(lessons, "08_b.ipynb") == ["lessons/08_b.ipynb"]
    with pytest.raises(SystemExit, match=r"\['09_x'\]: not lessons.*'00_a', '08_b'"):
        build.selected(lessons, "00_a,09_x")


def test_a_lesson_that_raises_fails_the_build(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("raise ValueError('boom 42')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    (tmp_path / "lessons").mkdir()
    nbformat.write(nb, tmp_path / "lessons" / "99_broken.ipynb")
    staging = tmp_path / "staging"
    (staging / "lessons").mkdir(parents=True)
    monkeypatch.setattr(build, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"lessons/99_broken.ipynb did not run(.|\n)*boom 42"):
        build.execute_lessons(["lessons/99_broken.ipynb"], staging, jobs=1)


# -- drawing MyST's AST -------------------------------------------------------------------------
def page(**widgets: dict) -> render.Page:
    return render.Page(location="lessons/README.md", slugs={"index", "fsdp"}, repo="o/r",
                       widgets=widgets)


def test_links_go_to_pages_downloads_or_the_repository() -> None:
    p = page()
    assert p.href({"url": "/fsdp#prefetch", "internal": True}) == "fsdp.html#prefetch"
    assert p.href({"url": "/"}) == "index.html"
    assert p.href({"url": "/08_fsdp-abc.ipynb", "static": True}) == "08_fsdp-abc.ipynb"
    assert p.href({"url": "/x", "urlSource": "../toolkit/hub.py"}) == \
        "https://github.com/o/r/blob/HEAD/toolkit/hub.py"
    assert p.href({"url": "https://arxiv.org/abs/1910.02054"}) == "https://arxiv.org/abs/1910.02054"


def test_without_a_repository_a_source_link_is_its_text() -> None:
    p = render.Page(location="docs/x.md", slugs=set(), repo=None, widgets={})
    assert p.href({"url": "/x", "urlSource": "../toolkit/hub.py"}) is None
    assert p.node({"type": "link", "url": "/x", "urlSource": "../toolkit/hub.py",
                   "children": [{"type": "text", "value": "hub"}]}) == "hub"


def test_a_folders_readme_page_is_named_after_its_folder() -> None:
    assert render.page_name("readme-3", "/labs/03_sharded_optimizer/README.md") == \
        "labs-03-sharded-optimizer"
    assert render.page_name("readme", "labs/README.md") == "labs"
    assert render.page_name("index", "lessons/README.md") == "index"
    assert render.page_name("grading", "docs/grading.md") == "grading"
    p = render.Page(location="labs/README.md", slugs={"readme-1"}, repo=None, widgets={},
                    names={"readme-1": "labs-01-collectives"})
    assert p.href({"url": "/readme-1#try-it", "internal": True}) == \
        "labs-01-collectives.html#try-it"


def test_the_run_it_live_bar_names_make_lab_and_binder_only_when_set() -> None:
    bar = render.live_bar("lessons/08_fsdp.ipynb", executed=True, repo=None)
    assert "make lab" in bar and "8888" not in bar and "mybinder" not in bar
    bar = render.live_bar("lessons/08_fsdp.ipynb", executed=True, repo="o/course")
    binder = "https://mybinder.org/v2/gh/o/course/HEAD?urlpath=lab/tree/lessons/08_fsdp.ipynb"
    assert f'href="{binder}"' in bar


def test_a_plotly_output_becomes_a_figure_and_escapes_its_script() -> None:
    fig = '{"data": [{"y": [1, 2], "name": "</script><b>x"}], "layout": {}}'
    got = page().bundle({render.PLOTLY: fig, "text/html": "<p>fallback</p>"})
    assert got.count('class="plotly-figure"') == 1 and "fallback" not in got
    assert "</script><b>" not in got.split("<script", 1)[1].rsplit("</script>", 1)[0]
    plain = page().bundle({"text/plain": "<tensor>"})
    assert plain == '<pre class="text-output">&lt;tensor&gt;</pre>'


def test_a_large_output_myst_saved_as_a_file_is_read_back(tmp_path: Path) -> None:
    (tmp_path / "ab12.json").write_text('{"data": [{"y": [5]}], "layout": {}}')
    p = render.Page(location="lessons/x.ipynb", slugs=set(), repo="o/r", widgets={},
                    public=tmp_path)
    out = {"output_type": "display_data", "data": {
        render.PLOTLY: {"content_type": render.PLOTLY, "hash": "ab12", "path": "/ab12.json"}}}
    assert '{"data": [{"y": [5]}], "layout": {}}' in p.output(out)
    png = {"output_type": "display_data", "data": {
        "image/png": {"content_type": "image/png", "hash": "cd", "path": "/cd.png"}}}
    assert p.output(png) == '<img class="output" src="cd.png" alt="">'
    out["data"][render.PLOTLY]["path"] = "/missing.json"
    with pytest.raises(FileNotFoundError, match="lessons/x.ipynb.*'missing.json'"):
        p.output(out)


def test_a_widget_is_drawn_from_its_saved_state_with_the_figure_inside() -> None:
    fig = {"output_type": "display_data",
           "data": {render.PLOTLY: {"data": [{"y": [3, 1]}], "layout": {}}}}
    models = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_o"]}},
        "s": {"model_name": "FloatLogSliderModel",
              "state": {"description": "params", "value": 1e9, "min": 6, "max": 12, "base": 10}},
        "o": {"model_name": "OutputModel", "state": {"outputs": [fig]}},
    }
    got = page(**models).bundle({render.WIDGET: '{"model_id": "box"}', "text/plain": "VBox()"})
    assert "widget-static" in got and "params" in got and "<output>1e+09</output>" in got
    assert re.search(r'min="6" max="12" value="9.0"', got) and got.count("plotly-figure") == 1
    assert '{"data": [{"y": [3, 1]}], "layout": {}}' in got   # the figure itself, not null


# -- one real build -----------------------------------------------------------------------------
def fastest_lesson_with_a_figure() -> str:
    rows = lesson_resources((ROOT / "lessons" / "README.md").read_text())
    drawn = [r for r in rows if "plotly" in (ROOT / "lessons" / r.notebook).read_text()
             or "viz." in (ROOT / "lessons" / r.notebook).read_text()]
    assert drawn, "no lesson in the map has a measured run time and a figure"
    return min(drawn, key=lambda r: r.run_s).notebook


needs_node = pytest.mark.skipif(shutil.which("node") is None,
                                reason="Jupyter Book 2 needs Node.js >= 18 (make node)")
# The tests below share one build (the `site` fixture): under `make test` (pytest-xdist) this
# file runs on one worker (conftest.py's ONE_WORKER_FILES), so it is built once.


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("site")
    lesson = fastest_lesson_with_a_figure()
    assert build.main(["--out", str(out), "--execute", lesson, "--jobs", "1"]) == 0
    return out / "html", lesson


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        url = a.get("href") if tag in ("a", "link") else a.get("src") if tag in ("script", "img") \
            else None
        if url:
            self.urls.append(url)


def parse(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text())
    return links


@needs_node
@pytest.mark.slow
def test_every_internal_link_of_the_site_resolves(site: tuple[Path, str]) -> None:
    html, lesson = site
    pages = {p.name: parse(p) for p in html.glob("*.html")}
    assert "index.html" in pages and len(pages) >= 1 + len(list((ROOT / "lessons").glob("*.ipynb")))
    labs = sorted(p.parent.name for p in (ROOT / "labs").glob("*/checks.py"))
    assert {f"labs-{lab.replace('_', '-')}.html" for lab in labs} <= set(pages)
    # The student edition: no instructors' section, no solution, no instructors' page.
    text = "".join((html / name).read_text() for name in pages)
    assert "For instructors" not in text
    assert not {"teaching.html", "jupyterhub.html"} & set(pages)
    broken = []
    for name, links in pages.items():
        for url in links.urls:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc:
                continue   # Binder, GitHub, papers: outside the site
            target = unquote(parts.path) or name
            if not (html / target).is_file():
                broken.append(f"{name} -> {url}")
            elif parts.fragment and target in pages and parts.fragment not in pages[target].ids:
                broken.append(f"{name} -> {url} (no such anchor)")
    assert not broken, broken
    # The landing page links every lesson's page, its file name as the link's text (MyST puts
    # zero-width spaces into it where a line may break).
    index = (html / "index.html").read_text().replace("\u200b", "")
    for nb in (ROOT / "lessons").glob("*.ipynb"):
        found = re.search(rf'<a href="([^"#]+\.html)">{re.escape(nb.name)}</a>', index)
        assert found and (html / found.group(1)).is_file(), f"index.html does not link {nb.name}"


@pytest.fixture(scope="module")
def served(site: tuple[Path, str]) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site[0]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@needs_node
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=MISSING)
def test_site_in_a_browser_landing_page_and_a_drawn_figure(site: tuple[Path, str],
                                                           served: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    html, lesson = site
    slug = next(p.stem for p in html.glob("*.html")
                if f"lessons/{lesson}" in p.read_text() and 'class="run-live"' in p.read_text())
    failed: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            view = browser.new_page(viewport={"width": 1280, "height": 900})
            view.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
            view.goto(f"{served}/index.html")
            assert view.inner_text("h1.page-title") == "Lesson map"
            links = dict(view.eval_on_selector_all(
                "main a", "els => els.map(e => [e.textContent.replaceAll('\\u200b', ''), e.href])"))
            missing = [nb.name for nb in (ROOT / "lessons").glob("*.ipynb")
                       if not links.get(nb.name, "").endswith(".html")]
            assert not missing, f"the landing page does not link {missing}"
            view.goto(f"{served}/{slug}.html")
            drawn = """() => [...document.querySelectorAll('.js-plotly-plot')]
                .filter(e => e.querySelector('.main-svg')?.getBoundingClientRect().width > 100)
                .length"""
            want = (html / f"{slug}.html").read_text().count('class="plotly-figure"')
            assert want >= 1
            view.wait_for_function(f"() => ({drawn})() >= {want}", timeout=30_000)
            (ROOT / "build" / "browser").mkdir(parents=True, exist_ok=True)
            view.screenshot(path=str(ROOT / "build" / "browser" / f"site-{slug}.png"))
        finally:
            browser.close()
    assert not failed, failed
