"""Every page of the built book in a real headless browser: math typeset, images loaded.

Needs Debian's chromium and chromium-driver and the npm package mathjax@3 in
.cache/ (``make mathjax``); `.ci/run` installs all three. Skipped where they
are absent. The default build serves that local MathJax from ``_static``
(``_ext/offline_mathjax.py``), so the pages are checked as a reader who opens
them offline sees them: served on 127.0.0.1, no CDN reachable, one
screenshot per page saved under _build/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATHJAX = ROOT / ".cache" / "node_modules" / "mathjax" / "es5"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
OUT = ROOT / "_build" / "offline"
SHOTS = ROOT / "_build" / "screenshots"

HAVE_BROWSER = bool(CHROMIUM and DRIVER and MATHJAX.is_dir())
if os.environ.get("REQUIRE_BROWSER") and not HAVE_BROWSER:  # CI sets it: never skip there
    raise RuntimeError("REQUIRE_BROWSER is set but chromium, chromedriver or the local MathJax is missing")
pytestmark = pytest.mark.skipif(
    not HAVE_BROWSER, reason="needs chromium, chromedriver and .cache/node_modules/mathjax (make mathjax)"
)


def _toc_pages() -> list[str]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(items):
        for it in items or []:
            if "file" in it:
                pages.append(it["file"])
            walk(it.get("chapters")), walk(it.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return pages


def _build_offline() -> Path:
    """The book as built by default (with the local MathJax, which the build serves from _static).

    ``make test`` builds the book first and passes it in ``BOOK_HTML``; run
    alone, the test builds its own copy into _build/offline.
    """
    given = os.environ.get("BOOK_HTML")
    if given:
        html = Path(given)
        assert (html / "index.html").is_file(), f"BOOK_HTML={given} holds no built book"
        return html
    shutil.rmtree(OUT, ignore_errors=True)
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb), "build", str(ROOT), "--path-output", str(OUT), "-W", "-n", "--keep-going"],
                   check=True, capture_output=True, text=True)
    # the Chinese edition beside it, as `make book` lays it out (tools/zh.py writes its source into zh/)
    subprocess.run([sys.executable, str(ROOT / "tools" / "zh.py"), "build"], check=True, capture_output=True, text=True)
    subprocess.run([str(jb), "build", str(ROOT / "zh"), "--path-output", str(OUT / "zh"), "-W", "-n", "--keep-going"],
                   check=True, capture_output=True, text=True)
    shutil.copytree(OUT / "zh" / "_build" / "html", OUT / "_build" / "html" / "zh")
    return OUT / "_build" / "html"


@pytest.fixture(scope="module")
def site():
    html = _build_offline()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync", "--window-size=1280,1600"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
if (!window.MathJax || !MathJax.startup || !MathJax.startup.promise) { done("no-mathjax"); return; }
MathJax.startup.promise.then(() => done("ok")).catch(e => done("error: " + e));
"""

INSPECT = """
const body = document.querySelector("main") || document.body;
const clone = body.cloneNode(true);
clone.querySelectorAll("pre, code, script, style, mjx-container, .highlight").forEach(e => e.remove());
const imgs = [...document.images].filter(i => i.offsetParent !== null || i.closest("main"));
return {
  math: document.querySelectorAll("mjx-container").length,
  errors: document.querySelectorAll("mjx-merror").length,
  // CHTML draws glyphs with CSS, so text inside typeset math is an undefined macro shown as text
  undefinedMacros: [...document.querySelectorAll("mjx-container")].map(c => c.textContent).filter(t => /\\[A-Za-z]/.test(t)),
  text: clone.innerText,
  broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src")),
  images: imgs.length,
  hasMathMarkup: document.querySelectorAll(".math, .MathJax_Preview, span.math, div.math").length,
  mathjaxSrc: [...document.scripts].map(s => s.getAttribute("src") || "").filter(s => /mathjax/i.test(s)),
};
"""

# Display equations against the text column: the typeset width plus the equation number must fit the
# math block's box; where it does not (a phone), the block must scroll sideways, not be cut.
LAYOUT = """
const out = [];
document.querySelectorAll("main div.math").forEach((div, k) => {
  const math = div.querySelector("mjx-container > mjx-math") || div.querySelector("mjx-container");
  if (!math) return;
  const eqno = div.querySelector(".eqno");
  const need = math.getBoundingClientRect().width + (eqno ? eqno.getBoundingClientRect().width : 0);
  const have = div.clientWidth;
  let scroll = false;
  for (let e = div; e && e.tagName !== "MAIN"; e = e.parentElement) {
    const o = getComputedStyle(e).overflowX;
    if (o === "auto" || o === "scroll") { scroll = true; break; }
  }
  if (need > have + 1) out.push({k, need: Math.round(need), have: Math.round(have), scroll,
                                 label: eqno ? eqno.textContent.trim() : div.textContent.slice(0, 40)});
});
return out;
"""

VISIBLE_CODE = """
return [...document.querySelectorAll("main .cell_input, main div.highlight")]
  .filter(e => e.offsetParent !== null)
  .map(e => e.innerText);
"""


# Issue 26: results must fit the column. An output block or a table wider than its column is cut (or needs
# sideways scrolling) at 1280 px: forbidden there; on a phone it must at least scroll, never be cut.
WIDE_BLOCKS = """
const col = (document.querySelector("main article") || document.querySelector("main")).getBoundingClientRect();
const out = [];
document.querySelectorAll("main .cell_output pre, main .output pre, main table").forEach(e => {
  if (e.offsetParent === null) return;  // inside a collapsed dropdown
  const r = e.getBoundingClientRect();
  const over = Math.max(e.scrollWidth - e.clientWidth, r.right - col.right);
  if (over <= 1) return;
  let scroll = false;
  for (let p = e; p && p.tagName !== "MAIN"; p = p.parentElement) {
    const o = getComputedStyle(p).overflowX;
    if ((o === "auto" || o === "scroll") && p.getBoundingClientRect().right <= col.right + 1) { scroll = true; break; }
  }
  out.push({tag: e.tagName, over: Math.round(over), scroll, text: e.innerText.slice(0, 60)});
});
return out;
"""

# A figure shown much smaller than drawn has unreadable labels: at 1280 px each figure must be shown at 80% of
# its drawn size or more (vl.BOOK_STYLE draws them 680 px wide, the column's width).
FIGURE_SCALE = """
return [...document.querySelectorAll("main img")].filter(i => /_images\//.test(i.src) && i.naturalWidth > 0)
  .map(i => ({src: i.getAttribute("src").split("/").pop().slice(0, 12), scale: i.width / i.naturalWidth}));
"""

# The equation number sits outside the box that scrolls, so a long equation never runs under it.
EQNO_OVERLAP = """
const out = [];
document.querySelectorAll("main div.math").forEach(div => {
  const eqno = div.querySelector(".eqno"), box = div.querySelector("mjx-container");
  if (!eqno || !box) return;
  const a = eqno.getBoundingClientRect(), b = box.getBoundingClientRect();
  const overlap = Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  if (overlap) out.push(eqno.textContent.trim());
});
return out;
"""

PAGE_WIDTH = "return document.documentElement.scrollWidth;"

WIDTHS = {"desktop": 1280, "phone": 390}
RAW_TEX = re.compile(r"\\(?:frac|sum|mathbb|mathrm|hat|left|right|gamma|lambda|delta|qquad|quad|le|ge|text|begin|end)\b"
                     r"|\$[^$\n]{2,}\$")


# every page of both editions: the Chinese one (issue 29) is the same pages under zh/
PAGES = _toc_pages() + ["zh/" + p for p in _toc_pages()]


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("page", PAGES)
def test_page_renders(site, browser, page, width):
    browser.set_window_size(WIDTHS[width], 1600)
    browser.get(f"{site}/{page}.html")
    status = browser.execute_async_script(WAIT_FOR_MATHJAX)
    info = browser.execute_script(INSPECT)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / (page.replace("/", "__") + f"-{width}.png")))
    assert all("_static/mathjax/" in src and "://" not in src for src in info["mathjaxSrc"]), (
        f"{page}: MathJax not served by the book itself: {info['mathjaxSrc']}")
    if info["hasMathMarkup"]:
        assert status == "ok", f"{page}: MathJax did not start ({status})"
        assert info["math"] > 0, f"{page}: math markup present but nothing typeset"
    assert info["errors"] == 0, f"{page}: {info['errors']} MathJax error(s)"
    assert not info["undefinedMacros"], f"{page}: undefined TeX macros {info['undefinedMacros'][:5]}"
    for raw in ("$$", "\\(", "\\)", "\\[", "\\begin{"):
        assert raw not in info["text"], f"{page}: raw TeX {raw!r} left in the page"
    raw_tex = RAW_TEX.findall(info["text"])
    assert not raw_tex, f"{page}: raw TeX in the visible text: {raw_tex[:5]}"
    assert not info["broken"], f"{page}: images failed to load: {info['broken']}"
    wide = browser.execute_script(LAYOUT)
    if width == "desktop":
        assert not wide, f"{page}: display equations wider than the column at 1280 px: {wide}"
    else:
        cut = [w for w in wide if not w["scroll"]]
        assert not cut, f"{page}: display equations cut on a phone (no horizontal scroll): {cut}"
    shown = [c for c in browser.execute_script(VISIBLE_CODE) if "glue(" in c or "myst_nb" in c]
    assert not shown, f"{page}: a code cell showing glue(...) or its import to the reader: {shown[0][:200]!r}"
    blocks = browser.execute_script(WIDE_BLOCKS)
    if width == "desktop":
        assert not blocks, f"{page}: output blocks or tables wider than the column at 1280 px: {blocks[:4]}"
        small = [f for f in browser.execute_script(FIGURE_SCALE) if f["scale"] < 0.8]
        assert not small, f"{page}: figures shown below 80% of their drawn size (labels too small): {small}"
    else:
        cut = [b for b in blocks if not b["scroll"]]
        assert not cut, f"{page}: output blocks or tables cut on a phone (no horizontal scroll): {cut[:4]}"
    under = browser.execute_script(EQNO_OVERLAP)
    assert not under, f"{page}: equation numbers drawn over their equations at {width}: {under[:6]}"
    if page in ("api", "zh/api"):
        assert browser.execute_script(PAGE_WIDTH) <= WIDTHS[width] + 1, f"api page pans sideways at {width}"
    if page.startswith("zh/"):
        assert browser.execute_script("return document.documentElement.lang") == "zh-CN", page
        assert re.search(r"[\u4e00-\u9fff]", info["text"]), f"{page}: no Chinese text"


def test_the_chinese_fonts_are_installed():
    # the Chinese pages and the glossary's Chinese terms need a CJK font, or the browser draws empty boxes
    out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip(), "no font with Chinese glyphs (Debian: fonts-noto-cjk)"
    assert "Noto Sans CJK" in out.stdout or "Noto Serif CJK" in out.stdout, out.stdout[:300]


SECTION_IN_VIEW = """
const all = [...new Set(document.querySelectorAll("main article section[id], article.bd-article section[id]"))];
let at = 0;
all.forEach((s, i) => { if (s.getBoundingClientRect().top <= 90) at = i; });
return {at, n: all.length, id: all[at] ? all[at].id : null};
"""


@pytest.mark.parametrize("page, k", [("chapters/05_gae", 4), ("chapters/12_critic_in_ppo", 6), ("notation", 2)])
def test_the_language_switch_lands_on_the_same_section(site, browser, page, k):
    """English page, section k in view -> the switch -> the Chinese page with its section k in view, and back."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(1280, 900)
    for start, other, lang in ((page, "zh/" + page, "zh-CN"), ("zh/" + page, page, "en")):
        browser.get(f"{site}/{start}.html")
        browser.execute_async_script(WAIT_FOR_MATHJAX)
        sections = browser.execute_script(
            'return [...new Set(document.querySelectorAll("main article section[id], article.bd-article section[id]"))]'
            '.map(s => s.id)')
        assert len(sections) > k, f"{start}: {len(sections)} sections"
        browser.execute_script(f"document.getElementById({sections[k]!r}).scrollIntoView();")
        assert browser.execute_script(SECTION_IN_VIEW)["at"] == k
        link = browser.find_element(By.CSS_SELECTOR, "a.vl-language-switch")
        assert link.is_displayed() and link.get_attribute("hreflang") == lang
        link.click()
        WebDriverWait(browser, 30).until(lambda b: b.current_url.split("#")[0].split("?")[0].endswith(f"/{other}.html"))
        browser.execute_async_script(WAIT_FOR_MATHJAX)
        browser.execute_script(
            'const m = /section=(\\d+)/.exec(location.search) || []; '
            'const s = [...new Set(document.querySelectorAll("main article section[id], article.bd-article section[id]"))];'
            'if (location.hash) { const t = document.getElementById(location.hash.slice(1)); if (t) t.scrollIntoView(); }')
        landed = browser.execute_script(SECTION_IN_VIEW)
        assert landed["n"] == len(sections), f"{other}: {landed['n']} sections, {start}: {len(sections)}"
        assert landed["at"] == k, f"{start} section {k} -> {other} section {landed['at']}"
