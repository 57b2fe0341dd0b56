"""MyST's AST (the `--site` build's content/*.json, MyST spec: https://mystmd.org/spec) as HTML.

One page per MyST page, all in one folder, every link relative (so the site works under any
path, GitHub Pages' /REPO/ included). Notebook outputs are drawn from their Jupyter MIME bundle
in the usual priority (widget, plotly, HTML, images, Markdown, plain text); plotly figures stay
interactive with the plotly.js that ships in the plotly package; widgets are drawn from the
state the executed notebook saved (nbclient's store_widget_state), disabled: no kernel here.
"""

from __future__ import annotations

import html
import json
import posixpath
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import plotly

from site_widgets import render_widget  # website/site_widgets.py

from autograder.edition import binder_url

STATIC = Path(__file__).resolve().parent / "static"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
TAGS = {"paragraph": "p", "emphasis": "em", "strong": "strong", "blockquote": "blockquote",
        "listItem": "li", "tableRow": "tr", "delete": "del", "subscript": "sub",
        "superscript": "sup", "admonitionTitle": "p class=\"admonition-title\"",
        "caption": "figcaption", "container": "figure"}
SKIP = {"comment", "mystComment", "mystTarget", "footnoteDefinition"}


def esc(text: str) -> str:
    return html.escape(text, quote=True)


class FileRef(str):
    """A binary output MyST saved as a file of the site (an image): drawn by its address."""


class Page:
    """Turns one page's AST into HTML; knows the site's pages for its links."""

    def __init__(self, *, location: str, slugs: set[str], repo: str | None,
                 widgets: dict[str, Any], public: Path | None = None,
                 names: dict[str, str] | None = None):
        self.location = location.lstrip("/")   # the page's source, repository-relative
        self.public = public                   # MyST's public/: large outputs saved as files
        self.slugs = slugs
        self.names = names or {}               # slug -> the page's file name (`page_name`)
        self.repo = repo                       # the student repository on GitHub, or None
        self.widgets = widgets                 # model_id -> {model_name, state, ...}
        self.figures = 0

    # -- links --------------------------------------------------------------------------
    def href(self, node: dict[str, Any]) -> str | None:
        """Where a link goes; None for a repository file when no repository is set (the link
        is then drawn as its text)."""
        url = node.get("url", "")
        if re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith("#"):
            return url
        path, _, anchor = url.partition("#")
        anchor = f"#{anchor}" if anchor else ""
        slug = path.strip("/")
        if node.get("internal") or slug in self.slugs or path == "/":
            return f"{self.names.get(slug, slug or 'index')}.html{anchor}"
        if node.get("static"):
            return path.lstrip("/")                # MyST copied the file into public/
        # A repository file the site does not hold (toolkit code): link it on GitHub.
        if self.repo is None:
            return None
        source = node.get("urlSource", url)
        target = posixpath.normpath(posixpath.join(posixpath.dirname(self.location), source))
        return f"https://github.com/{self.repo}/blob/HEAD/{target}"

    # -- nodes --------------------------------------------------------------------------
    def children(self, node: dict[str, Any]) -> str:
        return "".join(self.node(c) for c in node.get("children", []) or [])

    def node(self, n: dict[str, Any]) -> str:
        kind = n.get("type", "")
        if kind in SKIP:
            return ""
        if kind == "text":
            return esc(n.get("value", ""))
        if kind == "inlineCode":
            return f"<code>{esc(n.get('value', ''))}</code>"
        if kind == "code":
            lang = esc(n.get("lang") or "")
            code = esc(n.get("value", ""))
            return f'<pre class="code"><code class="language-{lang}">{code}</code></pre>'
        if kind == "heading":
            depth = min(max(int(n.get("depth", 2)), 1), 6)
            ident = esc(n.get("html_id") or n.get("identifier") or "")
            return f'<h{depth} id="{ident}">{self.children(n)}</h{depth}>'
        if kind in ("link", "crossReference"):
            url = self.href(n) if "url" in n else f"#{n.get('html_id') or n.get('identifier', '')}"
            return self.children(n) if url is None else \
                f'<a href="{esc(url)}">{self.children(n)}</a>'
        if kind == "list":
            tag = "ol" if n.get("ordered") else "ul"
            start = f' start="{int(n["start"])}"' if n.get("ordered") and n.get("start") else ""
            return f"<{tag}{start}>{self.children(n)}</{tag}>"
        if kind == "table":
            return f'<div class="table"><table>{self.children(n)}</table></div>'
        if kind == "tableCell":
            tag = "th" if n.get("header") else "td"
            return f"<{tag}>{self.children(n)}</{tag}>"
        if kind in ("math", "inlineMath"):
            if n.get("html"):
                return n["html"]
            tag = "div" if kind == "math" else "span"
            return f'<{tag} class="tex"><code>{esc(n.get("value", ""))}</code></{tag}>'
        if kind == "image":
            src = n.get("url", "")
            src = src if re.match(r"^(https?|data):", src) else src.lstrip("/")
            return f'<img src="{esc(src)}" alt="{esc(n.get("alt", ""))}">'
        if kind == "html":
            return n.get("value", "")
        if kind == "break":
            return "<br>"
        if kind == "thematicBreak":
            return "<hr>"
        if kind == "admonition":
            return f'<div class="admonition {esc(n.get("kind", "note"))}">{self.children(n)}</div>'
        if kind == "output":
            return self.output(n.get("jupyter_data") or {})
        if kind == "outputs":
            return f'<div class="outputs">{self.children(n)}</div>'
        if kind == "block" and n.get("kind") == "notebook-code":
            return f'<div class="cell">{self.children(n)}</div>'
        if kind in TAGS:
            tag = TAGS[kind]
            return f"<{tag}>{self.children(n)}</{tag.split()[0]}>"
        return self.children(n)   # root, block, footnotes, spans: their content

    # -- notebook outputs ---------------------------------------------------------------
    def output(self, out: dict[str, Any]) -> str:
        kind = out.get("output_type")
        if kind == "stream":
            cls = "stderr" if out.get("name") == "stderr" else "stdout"
            return f'<pre class="{cls}">{esc(ANSI.sub("", out.get("text", "")))}</pre>'
        if kind == "error":
            trace = ANSI.sub("", "\n".join(out.get("traceback", [])))
            return f'<pre class="error">{esc(trace)}</pre>'
        return self.bundle({mime: self.value(v) for mime, v in (out.get("data") or {}).items()})

    def value(self, v: Any) -> Any:
        """MyST wraps each MIME entry as {content, content_type}, or, when large, {path, hash}
        of a file it saved in public/; a raw Jupyter output (an Output widget's saved state)
        holds the value itself (a plotly figure as a dict)."""
        if not (isinstance(v, dict) and "content_type" in v):
            return v
        if "content" in v:
            return v["content"]
        path = str(v.get("path", "")).lstrip("/")
        if v["content_type"].startswith("image/") and v["content_type"] != "image/svg+xml":
            return FileRef(path)
        if self.public is None or not (self.public / path).is_file():
            raise FileNotFoundError(f"{self.location}: output {v['content_type']} saved as "
                                    f"{path!r}, which MyST's public/ folder does not hold")
        return (self.public / path).read_text()

    def bundle(self, data: dict[str, Any]) -> str:
        """The richest representation of a MIME bundle that a static page can show."""
        if WIDGET in data:
            view = data[WIDGET]
            view = json.loads(view) if isinstance(view, str) else view
            if view.get("model_id") in self.widgets:
                inner = render_widget(view["model_id"], self.widgets, self.outputs_html)
                return (f'<div class="widget-static" title="saved state: run the lesson live '
                        f'to move the controls">{inner}</div>')
        if PLOTLY in data:
            fig = data[PLOTLY]
            fig = fig if isinstance(fig, str) else json.dumps(fig)
            self.figures += 1
            payload = fig.replace("</", "<\\/")
            return (f'<div class="plotly-figure" id="fig-{self.figures}"></div>'
                    f'<script type="application/json" data-for="fig-{self.figures}">'
                    f"{payload}</script>")
        if "text/html" in data:
            return f'<div class="html-output">{data["text/html"]}</div>'
        for mime in ("image/png", "image/jpeg", "image/gif"):
            if mime in data:
                src = (data[mime] if isinstance(data[mime], FileRef)
                       else f"data:{mime};base64,{data[mime]}")
                return f'<img class="output" src="{esc(src)}" alt="">'
        if "image/svg+xml" in data:
            return f'<div class="svg-output">{data["image/svg+xml"]}</div>'
        for mime in ("text/markdown", "text/latex", "text/plain"):
            if mime in data:
                return f'<pre class="text-output">{esc(ANSI.sub("", str(data[mime])))}</pre>'
        return ""

    def outputs_html(self, outputs: list[dict[str, Any]]) -> str:
        """Raw Jupyter outputs (an Output widget's saved state), drawn like cell outputs."""
        return "".join(self.output(o) for o in outputs)


def notebook_widgets(path: Path) -> dict[str, Any]:
    """The widget models an executed notebook saved (empty for Markdown or unexecuted pages)."""
    if path.suffix != ".ipynb" or not path.exists():
        return {}
    meta = json.loads(path.read_text()).get("metadata", {})
    state = meta.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return state.get("state", {})


def page_name(slug: str, location: str) -> str:
    """A page's file name without .html: MyST's slug, except for a folder's README, which MyST
    numbers (readme-1, readme-2, ...): that one is named after its folders
    (labs/01_collectives/README.md -> labs-01-collectives)."""
    path = PurePosixPath(location.lstrip("/"))
    if slug != "index" and path.name.lower() == "readme.md" and len(path.parts) > 1:
        return "-".join(path.parts[:-1]).replace("_", "-").lower()
    return slug


def nav_html(pages: list[dict[str, Any]], current: str, names: dict[str, str]) -> str:
    items = []
    for p in pages:
        if not p.get("slug"):
            items.append(f'<li class="section">{esc(p.get("title", ""))}</li>')
            continue
        cls = ' class="current"' if p["slug"] == current else ""
        items.append(f'<li{cls}><a href="{names.get(p["slug"], p["slug"])}.html">'
                     f'{esc(p.get("title", ""))}</a></li>')
    return "<ul>" + "".join(items) + "</ul>"


def live_bar(location: str, *, executed: bool, repo: str | None, download: str = "") -> str:
    """For a lesson: where to run it (`make lab` on your machine, Binder when the student
    repository is set) and its download. No link to a local JupyterLab: its port and token
    are the ones `make lab` prints, not known here."""
    if not location.endswith(".ipynb") or not location.startswith("lessons/"):
        return ""
    binder = (f' · <a href="{esc(binder_url(repo, location))}">on Binder</a>'
              if repo else "")
    note = ("" if executed else
            '<p class="not-executed">This build did not execute this lesson: code without '
            "outputs. The full site (<code>make site</code>) shows every output.</p>")
    return (f'<div class="run-live">Run it live: <code>make lab</code> in the course\'s folder, '
            f"then open <code>{esc(location)}</code> in the JupyterLab it starts{binder}"
            + (f' · <a href="{esc(download)}" download>the notebook</a>' if download else "")
            + ". Sliders and "
            f"figures here are a saved copy of one run.</div>{note}")


def render_site(myst_site: Path, staging: Path, out: Path, *, executed: set[str],
                repo: str | None) -> int:
    """Write one HTML page per MyST page into out/; returns the number of pages."""
    config = json.loads((myst_site / "config.json").read_text())
    project = config["projects"][0]
    index = project.get("index", "index")
    pages = [{"slug": index, "title": "Lesson map"}] + project["pages"]
    slugs = {p["slug"] for p in pages if p.get("slug")}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if (myst_site / "public").exists():   # downloads MyST copied: notebooks, lab files
        shutil.copytree(myst_site / "public", out, dirs_exist_ok=True)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    shutil.copy(plotly_js, out / "plotly.min.js")
    for name in ("style.css", "figures.js"):
        shutil.copy(STATIC / name, out / name)
    shell = (STATIC / "page.html").read_text()
    contents = {p["slug"]: json.loads((myst_site / "content" / f"{p['slug']}.json").read_text())
                for p in pages if p.get("slug")}
    names = {slug: page_name(slug, c.get("location", "")) for slug, c in contents.items()}
    for p in pages:
        if not p.get("slug"):
            continue
        content = contents[p["slug"]]
        location = content.get("location", "").lstrip("/")
        page = Page(location=location, slugs=slugs, repo=repo, names=names,
                    widgets=notebook_widgets(staging / location), public=myst_site / "public")
        body = page.node(content["mdast"])
        front = content.get("frontmatter", {})
        title = front.get("title") or p.get("title", "")
        download = next((e["url"].lstrip("/") for e in front.get("exports", [])
                         if e.get("format") == "ipynb" and e.get("url")), "")
        filled = (shell.replace("{{site}}", esc(project.get("title", "")))
                  .replace("{{title}}", esc(title))
                  .replace("{{nav}}", nav_html(pages, p["slug"], names))
                  .replace("{{live}}", live_bar(location, executed=location in executed,
                                                repo=repo, download=download))
                  .replace("{{body}}", body))
        (out / f"{names[p['slug']]}.html").write_text(filled)
    return len(slugs)
