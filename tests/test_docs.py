"""The documentation site (`make docs`): built with mkdocs from the notebooks as committed (with their outputs:
tests/test_notebooks.py checks they are current), opened page by page in headless Debian chromium, which must render
every plot of every page, show no stderr block and find no broken internal link."""
import functools, http.server, json, os, re, shutil, subprocess, sys, threading, time, urllib.parse, urllib.request
from pathlib import Path
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build       # docs/build.py

slow = pytest.mark.slow            # the site built from every notebook's committed outputs, chromium

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]

def chromium_binary():
    "Debian's chromium, installed with apt-get when missing (CI starts on a fresh machine)."
    exe = shutil.which("chromium")
    if exe: return exe
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if p.returncode: pytest.fail(f"{' '.join(cmd)} failed; install Debian's chromium by hand:\n{p.stderr[-2000:]}")
    exe = shutil.which("chromium")
    if not exe: pytest.fail("apt-get installed chromium but no `chromium` is on PATH")
    return exe

class Browser:
    "Headless chromium driven over the DevTools protocol (websocket-client): navigate, evaluate JavaScript."
    def __init__(self, exe, profile: Path):
        import websocket
        self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                      "--window-size=1280,900", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, t = profile / "DevToolsActivePort", time.time()
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.time() - t > 60: raise RuntimeError("chromium did not start")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws, self.n = websocket.create_connection(url, timeout=60, suppress_origin=True), 0

    def call(self, method, **params):
        self.n += 1; self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg: raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, js):
        r = self.call("Runtime.evaluate", expression=js, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r: raise RuntimeError(f"{js[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url):
        "Navigate and wait until the page and all its images have loaded."
        self.call("Page.navigate", url=url)
        t = time.time()
        while self.eval(f"document.readyState === 'complete' && location.href === {json.dumps(url)}") is not True:
            if time.time() - t > 60: raise RuntimeError(f"{url} did not load")
            time.sleep(0.1)
        self.eval("Promise.all(Array.from(document.images).map(i => i.complete ? 1 : "
                  "new Promise(r => { i.onload = i.onerror = r; })))")

    def close(self):
        self.ws.close(); self.proc.terminate(); self.proc.wait(timeout=30)

@pytest.fixture(scope="session")
def site(tmp_path_factory):
    "The site, built as `make docs` does: every notebook's page shows its committed outputs."
    out = tmp_path_factory.mktemp("site")
    info = docs_build.build(out, "none", work=tmp_path_factory.mktemp("docs_work"))
    return out, info["notes"]

@pytest.fixture(scope="session")
def served(site):
    out, _ = site
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
    handler = functools.partial(Quiet, directory=str(out))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()

# What the browser does not load but in the search test: the site's search index (2.7 MB), which each page fetches
# and hands to Material's search worker to build its lunr index (half the CPU of a page's visit), dropped at the next
# page. Nothing else a test reads depends on it (benchmarks/docs_survey.py: the same findings on every page).
NO_SEARCH_INDEX = ["*/search/search_index.json"]

@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    b = Browser(chromium_binary(), tmp_path_factory.mktemp("chromium-profile"))
    b.call("Network.enable"); b.call("Network.setBlockedURLs", urls=NO_SEARCH_INDEX)
    yield b
    b.close()

def expected_images(nb_path: Path) -> int:
    "Images among the outputs of the notebook the page was made from."
    nb = json.loads(nb_path.read_text())
    return sum(1 for c in nb["cells"] for o in c.get("outputs", []) if set(o.get("data", {})) & set(docs_build.IMAGE_TYPES))

# The page's tables a reader sees cut at the browser's 1280 px window: partly hidden though they fit the column when
# their text wraps, or running off the page with no box to scroll them in. `strip` removes the site's stylesheet.
TABLES_CUT = r"""((strip) => {
  if (strip) document.querySelectorAll('link[href*="extra.css"]').forEach(l => l.remove());
  const cut = [];
  for (const t of document.querySelectorAll('article table')) {
    let e = t.parentElement, clip = null;
    while (e && e !== document.body && !clip) {
      if (getComputedStyle(e).overflowX !== 'visible') clip = e;
      e = e.parentElement;
    }
    const right = clip ? clip.getBoundingClientRect().right : document.documentElement.clientWidth;
    if (t.getBoundingClientRect().right <= right + 1) continue;                  // shown whole
    const style = t.style.cssText; t.style.width = 'min-content'; t.style.maxWidth = 'none';
    const least = t.getBoundingClientRect().width; t.style.cssText = style;
    const scrolls = clip && ['auto', 'scroll'].includes(getComputedStyle(clip).overflowX);
    if (!scrolls) cut.push(['runs off the page', t.innerText.slice(0, 60)]);
    else if (least <= clip.clientWidth + 1) cut.push(['partly hidden though it fits', t.innerText.slice(0, 60)]);
  }
  return cut;
})"""

PAGE_INFO = """(() => ({
  title: document.title,
  text: document.querySelector('article') ? document.querySelector('article').innerText.length : 0,
  images: Array.from(document.querySelectorAll('article img')).map(i => [i.src.slice(0, 60), i.complete && i.naturalWidth > 0]),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
}))()"""

@slow
def test_site_has_home_notebook_pages_api_and_search(site):
    out, notes = site
    assert "Megatron-Turing NLG 530B" in (out / "index.html").read_text()          # the README is the home page
    for nb in docs_build.notebooks():
        assert (out / "nbs" / f"{nb.stem}.html").exists(), f"no page for {nb.name}"
    for mod in docs_build.modules():
        page = (out / "api" / f"{mod}.html").read_text()
        assert mod in page, mod
    cfg = (out / "api" / "mtnlg.config.html").read_text()
    assert "load_config" in cfg and "transformer blocks" in cfg        # a docstring and an inline parameter doc
    text = re.sub(r"<[^>]+>", "", cfg)
    assert "class ConfigError(ValueError)" in text and "class ParallelConfig:" in text, text[:2000]
    whole = re.sub(r"\s*\n\s*#\s*", " ", text)                     # a field's comment over several lines, whole
    assert re.search(r"cuBLASLt(&#39;|')s epilogue on a GPU\) instead of an add after it; same math", whole)
    assert not [m for m in docs_build.modules() if "VAR_POSITIONAL" in (out / "api" / f"{m}.html").read_text()]
    index = json.loads((out / "search" / "search_index.json").read_text())
    locs = {d["location"].split("#")[0] for d in index["docs"]}
    assert {"index.html", "nbs/01_memory.html", "api/mtnlg.config.html"} <= locs, sorted(locs)[:20]
    missing = sorted(k for k, v in notes.items() if v != "committed outputs")
    assert not missing, \
        f"pages of notebooks committed without outputs: run `make outputs STEMS=\"{' '.join(missing)}\"`"

def survey_pages(browser, out: Path, served: str) -> dict:
    "Every page of the site `out` opened once: what PAGE_INFO finds, its cut tables (TABLES_CUT), its stderr blocks."
    info = {}
    for page in sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html") if p.name != "404.html"):
        browser.open(served + page)
        info[page] = dict(browser.eval(PAGE_INFO), tables_cut=browser.eval(TABLES_CUT + "(false)"),
                          stderr=browser.eval(STDERR_BLOCKS))
    return info

@pytest.fixture(scope="session")
def survey(site, served, browser) -> dict:
    "Every page of the site opened once (`survey_pages`)."
    return survey_pages(browser, site[0], served)

@slow
def test_every_page_renders_its_plots_and_no_internal_link_is_broken(site, served, survey):
    out, _ = site
    info, plots = survey, {}
    for page in info:
        assert info[page]["text"] > 0, f"{page} shows no content"
        src = out / Path(page).with_suffix(".ipynb")
        if page.startswith("nbs/"): plots[page] = expected_images(src)
        broken_imgs = [src for src, ok in info[page]["images"] if not ok]
        assert not broken_imgs, f"{page}: images that do not render: {broken_imgs}"
        assert len(info[page]["images"]) >= plots.get(page, 0), \
            f"{page}: {plots[page]} plots in the notebook, {len(info[page]['images'])} rendered"
    broken = []
    for page, i in info.items():
        for href in i["links"]:
            u = urllib.parse.urlsplit(href)
            if not href.startswith(served): continue                  # external: not checked (no network here)
            target = urllib.parse.unquote(u.path[len(urllib.parse.urlsplit(served).path):]) or "index.html"
            f = out / target
            if f.is_dir(): f = f / "index.html"
            if not f.exists(): broken.append(f"{page} -> {href}"); continue
            if u.fragment and f.suffix == ".html":
                ids = info.get(f.relative_to(out).as_posix(), {}).get("ids")
                if ids is None: ids = re.findall(r'\bid="([^"]+)"', f.read_text())
                if urllib.parse.unquote(u.fragment) not in ids: broken.append(f"{page} -> {href} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(sorted(set(broken))[:30])
    tables_cut = {k: v["tables_cut"] for k, v in info.items() if v["tables_cut"]}
    assert not tables_cut, f"tables cut at 1280 px (docs/assets/stylesheets/extra.css): {tables_cut}"
    assert len(info["index.html"]["images"]) >= 1                   # the README's figures
    assert sum(plots.values()) > 0, "no notebook page has a plot: the notebooks' committed outputs should show theirs"

@slow
def test_search_finds_a_notebook_page(served, browser):
    browser.call("Network.setBlockedURLs", urls=[])                  # the one test that loads the search index
    try: hits = search_hits(browser, served)
    finally: browser.call("Network.setBlockedURLs", urls=NO_SEARCH_INDEX)
    assert any("01_memory" in h for h in hits), hits

def search_hits(browser, served: str) -> list[str]:
    "The result links the home page's search box lists for 'planner'."
    browser.open(served + "index.html")
    # the query typed again each second until results show: one typed before the search worker has built its index
    # (seconds on a busy machine) is not run again when it is ready
    hits = browser.eval("""new Promise(done => {
      const q = document.querySelector('input[data-md-component=search-query]');
      const type = () => { q.focus(); q.value = 'planner'; q.dispatchEvent(new Event('input', {bubbles: true}));
                           q.dispatchEvent(new KeyboardEvent('keyup')); };
      let n = 0; type(); const t = setInterval(() => {
        const r = Array.from(document.querySelectorAll('.md-search-result__link')).map(a => a.href);
        if (r.length || ++n > 500) { clearInterval(t); done(r); } else if (n % 10 == 0) type(); }, 100); })""")
    return hits

# mkdocs-jupyter's block for a cell's stderr (warnings, logs, progress bars), per page
STDERR_BLOCKS = """Array.from(document.querySelectorAll('article [data-mime-type="application/vnd.jupyter.stderr"]'))
  .map(e => e.innerText.trim().slice(0, 200))"""

@slow
def test_wide_tables_are_shown_whole_or_scroll_in_their_box(site, served, browser):
    """The demo report's evaluation table (wider than the column as its cells' text runs) is shown whole at 1280 px,
    its text wrapped; the dry-run table of 01_memory too; control: without the site's stylesheet the same page
    hides its evaluation table's last columns (the 5-shot and paper ones)."""
    browser.open(served + "nbs/12_demo_report.html")
    wide = browser.eval("""Array.from(document.querySelectorAll('article table')).filter(t => {
      const s = t.style.cssText; t.style.width = 'max-content'; t.style.maxWidth = 'none';
      const w = t.getBoundingClientRect().width; t.style.cssText = s; return w > t.parentElement.clientWidth + 1; })
      .map(t => t.innerText.slice(0, 40))""")
    assert any("5-shot" in w for w in wide), wide                # the evaluation table needs more than the column
    assert browser.eval(TABLES_CUT + "(false)") == []
    control = browser.eval(TABLES_CUT + "(true)")
    assert any(why == "partly hidden though it fits" and "5-shot" in text for why, text in control), control
    browser.open(served + "nbs/01_memory.html")
    assert browser.eval(TABLES_CUT + "(false)") == []
    assert browser.eval(TABLES_CUT + "(true)"), "01_memory's dry-run table fits without the site's stylesheet"

@slow
def test_no_page_shows_a_stderr_block(site, served, browser, survey, tmp_path, monkeypatch):
    "No notebook page shows stderr; control: a site of one notebook whose committed outputs hold a warning shows it."
    out, _ = site
    noisy = {nb.stem: survey[f"nbs/{nb.stem}.html"]["stderr"] for nb in docs_build.notebooks()}
    noisy = {k: v for k, v in noisy.items() if v}
    assert not noisy, f"pages with stderr blocks (fix the source, then `make outputs STEMS=...`): {noisy}"
    import nbformat
    (tmp_path / "nbs").mkdir()
    cell = nbformat.v4.new_code_cell("import warnings; warnings.warn('noise')", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="UserWarning: noise\n")])
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Noisy"), cell]),
                   tmp_path / "nbs" / "zz_noisy.ipynb")
    monkeypatch.setattr(docs_build, "NBS", tmp_path / "nbs")
    monkeypatch.setattr(docs_build, "modules", lambda: [])
    try:
        docs_build.build(out / "control", "none", work=tmp_path / "work")     # served beside the site, then removed
        browser.open(served + "control/nbs/zz_noisy.html")
        assert browser.eval(STDERR_BLOCKS) == ["UserWarning: noise"]
    finally: shutil.rmtree(out / "control", ignore_errors=True)

# --- formulas and code width (issue 44) ---------------------------------------------------------------------------
def poll(browser, js, done, seconds=30.0):
    "Evaluate `js` until `done(value)` or `seconds` have passed; its last value."
    t = time.time()
    while True:
        v = browser.eval(js)
        if done(v) or time.time() - t > seconds: return v
        time.sleep(0.2)

# A page's math as mkdocs-jupyter and arithmatex wrap it (`.arithmatex`), how much of it MathJax typeset, and TeX
# delimiters left as text in its prose (what a reader sees when no MathJax runs)
MATH = r"""(() => { const a = document.querySelector('article');
  const spans = Array.from(a.querySelectorAll('.arithmatex'));
  const prose = Array.from(a.querySelectorAll('.jp-MarkdownOutput')).map(e => e.innerText).join('\n');
  return {math: spans.length, typeset: spans.filter(s => s.querySelector('mjx-container')).length,
          raw: (prose.match(/\\\[|\\\(|\$\$/g) || []).length}; })()"""

def math_problems(browser, url, wait=30.0):
    "What keeps the page's formulas from showing as math ([] when every one is typeset and no TeX shows)."
    browser.open(url)
    m = poll(browser, MATH, lambda m: m["math"] and m["typeset"] == m["math"], wait)
    return ([f"{m['math'] - m['typeset']} of {m['math']} formulas not typeset"] if m["typeset"] < m["math"] else []) + \
           ([f"{m['raw']} TeX delimiters shown as text"] if m["raw"] else []) + ([] if m["math"] else ["no math"])

@slow
def test_formulas_render_as_math_from_the_local_mathjax(site, served, browser):
    "01_memory's formulas are typeset by the site's own MathJax (no CDN); control: with that file blocked, raw TeX."
    out, _ = site
    html = (out / "nbs" / "01_memory.html").read_text()
    scripts = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
    assert any(s.endswith("assets/mathjax/tex-mml-chtml.js") for s in scripts), scripts
    assert not [s for s in scripts if "//" in s], f"scripts from other hosts: {scripts}"     # offline: local only
    assert (out / "assets" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").is_dir()   # its fonts too
    url = served + "nbs/01_memory.html"
    assert math_problems(browser, url) == []
    n = browser.eval(MATH)["math"]
    assert n >= 50, n                                        # 01_memory's inline and display formulas
    try:
        browser.call("Network.setBlockedURLs", urls=NO_SEARCH_INDEX + ["*tex-mml-chtml.js"])   # control: no MathJax
        bad = math_problems(browser, url, wait=3.0)
        assert any("not typeset" in b for b in bad) and any("TeX delimiters" in b for b in bad), bad
    finally:
        browser.call("Network.setBlockedURLs", urls=NO_SEARCH_INDEX)

# The code cells' width at the browser's 1280 px window: the width 110 characters of their font need, the width a
# line has, and the code blocks that hide part of a line (scrolled sideways). `strip` removes the site's stylesheet.
CODE_WIDTH = r"""((strip) => {
  if (strip) document.querySelectorAll('link[href*="extra.css"]').forEach(l => l.remove());
  const pres = Array.from(document.querySelectorAll('article .jp-InputArea .highlight-ipynb pre'));
  const cs = getComputedStyle(pres[0]), pad = parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight);
  const probe = pres[0].cloneNode(false);              // a code block of one 110-character line, as wide as it needs
  probe.style.cssText = 'position:absolute;visibility:hidden;white-space:pre;width:auto;max-width:none';
  probe.textContent = 'x'.repeat(110); pres[0].parentNode.appendChild(probe);
  const need = probe.getBoundingClientRect().width - pad; probe.remove();
  const line = pres[0].clientWidth - pad;
  const cut = pres.filter(p => p.scrollWidth > p.clientWidth + 1)
                  .map(p => Math.max(...p.textContent.split('\n').map(l => l.length)));
  return {blocks: pres.length, need110: need, line: line, cut: cut,
          longest: Math.max(...pres.map(p => Math.max(...p.textContent.split('\n').map(l => l.length))))};
})"""

@slow
def test_code_lines_are_not_cut(site, served, browser):
    """A code line of up to 110 characters fits the content column at 1280 px, and no line is hidden (a longer one
    wraps); control: the same page without the site's stylesheet (docs/assets/stylesheets/extra.css) cuts lines."""
    browser.open(served + "nbs/03_model.html")
    w = browser.eval(CODE_WIDTH + "(false)")
    assert w["blocks"] > 10 and w["longest"] > 110, w          # the page has lines longer than 110 characters
    assert w["line"] >= w["need110"], w
    assert w["cut"] == [], w
    control = browser.eval(CODE_WIDTH + "(true)")
    assert control["line"] < control["need110"] and len(control["cut"]) > 5, control

# --- the API reference (issue 52) ---------------------------------------------------------------------------------
class _Settings:
    "A class with a constructor (for the API test)."
    def __init__(self, path, retries: int = 3):   # how often to try
        pass

def _call(a: int,          # the first
          b: str = "x",    # the second, which goes on
                           # on a second line
          *, c=None) -> dict:
    "A function with inline parameter docs (for the API test)."

@pytest.mark.filterwarnings("ignore:`cell_number` in settings.ini:DeprecationWarning")     # nbdev 2.4, for the controls
def test_api_signatures_read_as_the_code_declares_them():
    """Exceptions as `class E(Base)`, dataclasses with their fields, classes by their constructor, functions by their
    parameters; a comment over several lines shown whole. Controls: nbdev's show_doc renders them otherwise."""
    from mtnlg.config import ConfigError, ParallelConfig
    assert docs_build.signature(ConfigError, "ConfigError") == "class ConfigError(ValueError)"
    sig = docs_build.signature(ParallelConfig, "ParallelConfig")
    assert sig.startswith("@dataclass\nclass ParallelConfig:\n    tp: int = 1 ") and "tp=1: a block's four" in sig, sig
    first, second = [l for l in sig.splitlines() if "bias_in_gemm" in l or "cuBLASLt's epilogue" in l]
    assert first.index("#") == second.index("#"), sig                    # the comment's second line, under its first
    assert max(map(len, sig.splitlines())) <= docs_build.API_WIDTH, sig   # no line to scroll sideways to
    assert docs_build.signature(_Settings, "_Settings") == \
        "class _Settings(\n    path,\n    retries: int = 3,  # how often to try\n)"     # the line's last parameter
    assert docs_build.signature(_call, "_call") == (
        'def _call(\n    a: int,        # the first\n    b: str = "x",  # the second, which goes on on a second line\n'
        '    *,\n    c=None,\n) -> dict')                       # a comment's lines joined, wrapped at API_WIDTH
    from nbdev.showdoc import show_doc                                   # the controls: what the reference showed
    assert "VAR_POSITIONAL" in show_doc(ConfigError)._repr_markdown_()
    assert "cuBLASLt" not in show_doc(ParallelConfig)._repr_markdown_()

# --- timing claims: one recorded figure each (benchmarks/timings.json, written by benchmarks/timings.py) ----------
TIMINGS = ROOT / "benchmarks" / "timings.json"
TIMED = {"make demo": "demo", "make test-fast": "test_fast", "make test": "test"}   # longest first: test-fast

def timing_claims(text: str) -> list[tuple[str, int, str]]:
    """(figure, minutes, sentence) for each "N min"/"N minutes" in a sentence of `text` naming one command of TIMED
    (the figure `demo_fresh` when "fresh" follows the number); a sentence naming two commands: figure "ambiguous"."""
    out = []
    for sentence in re.split(r"(?<=[.;)])\s+(?=[A-Z`(])|\n\s*\n|\n(?=\S*make )", text):
        named = {TIMED[c] for c in TIMED if re.search(re.escape(c) + r"(?![-\w])", sentence)}
        for m in re.finditer(r"(\d+(?:\.\d+)?) (?:min|minutes)\b", sentence):
            figure = named.pop() if len(named) == 1 else ("ambiguous" if named else None)
            if figure: named.add(figure)
            if figure == "demo" and "fresh" in sentence[m.end():m.end() + 15]: figure = "demo_fresh"
            if figure: out.append((figure, float(m.group(1)), " ".join(sentence.split())[:160]))
    return out

def timing_sources() -> dict[str, str]:
    "{where: text} of the README, its source notebook and every notebook's cells (sources, not outputs)."
    texts = {"README.md": (ROOT / "README.md").read_text()}
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[f"nbs/{nb.name}"] = "\n\n".join("".join(c["source"]) for c in cells)
    return texts

def wrong_claims(texts: dict[str, str], recorded: dict) -> list[str]:
    "Each claim that is not its recorded figure, in whole minutes (or names no single figure)."
    bad = []
    for where, text in texts.items():
        for figure, minutes, sentence in timing_claims(text):
            want = round(recorded[figure]["seconds"] / 60) if figure in recorded else None
            if minutes != want: bad.append(f"{where}: {minutes:g} min for {figure} (recorded: {want}): {sentence}")
    return bad

def test_every_time_claimed_for_the_demo_and_the_suite_is_the_recorded_one():
    """Every "N minutes" said of `make demo`, `make test` or `make test-fast` in the README and the notebooks is the
    figure of benchmarks/timings.json, each written in benchmarks/RESULTS.md. Control: the old "12 minutes" claim."""
    recorded = json.loads(TIMINGS.read_text())
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert set(recorded) == {"demo", "demo_fresh", "test", "test_fast"}
    for figure, r in recorded.items():
        assert f"{r['seconds']:g}" in results, f"{figure}: {r['seconds']:g} s is not in RESULTS.md ({r['source']})"
    texts = timing_sources()
    found = [c for t in texts.values() for c in timing_claims(t)]
    assert {f for f, *_ in found} >= {"demo", "demo_fresh", "test", "test_fast"}, found     # the README's claims
    assert wrong_claims(texts, recorded) == []
    old = {"nbs/10_demo.ipynb": "These sizes keep `make demo` within 12 minutes on a 2-core machine (measured)."}
    assert len(wrong_claims(old, recorded)) == 1                       # control: the claim that disagreed is caught
    both = {"x": "`make demo` and `make test` take 8 minutes."}
    assert wrong_claims(both, recorded)[0].startswith("x: 8 min for ambiguous")

# --- the studies' notebooks say at their top what their committed outputs can show --------------------------------
STUDIES = ["07_eval", "13_generate", "14_samples", "15_bias", "16_icl"]
PAPER_NAMES = {"LAMBADA": "lambada", "BoolQ": "boolq", "RACE-h": "race_h", "PIQA": "piqa", "HellaSwag": "hellaswag",
               "WinoGrande": "winogrande", "ANLI R2": "anli_r2", "HANS": "hans", "WiC": "wic"}

def paper_table_misses(markdown: str) -> list[str]:
    "Cells of a '| task | 0-shot | 1-shot | few-shot |' table that are not MT-NLG's score in mtnlg.tasks (or blank)."
    from mtnlg.tasks import TASKS
    from mtnlg.results import paper_score
    bad = []
    for row in re.findall(r"(?m)^\| ([A-Za-z][\w -]*?) \|([^|\n]*)\|([^|\n]*)\|([^|\n]*)\|", markdown):
        if row[0] not in PAPER_NAMES: continue
        task = PAPER_NAMES[row[0]]
        for word, cell in zip(("zero", "one", "few"), row[1:]):
            want = paper_score(task, TASKS[task].headline, word)
            got = float(cell) if cell.strip() else float("nan")
            same = got == want or (got != got and want != want)                 # both blank (NaN) counts as same
            if not same: bad.append(f"{row[0]} {word}: {got} (mtnlg: {want})")
    return bad

def test_each_study_says_what_model_its_outputs_come_from_and_how_to_run_it_for_real():
    """The cell under each study's title names the random model its committed outputs come from, what they can and
    cannot show and the command for a trained run; 07_eval's paper figures are mtnlg.tasks' (control: one changed)."""
    for stem in STUDIES:
        cells = json.loads((ROOT / "nbs" / f"{stem}.ipynb").read_text())["cells"]
        top = "".join(cells[1]["source"])
        assert cells[1]["cell_type"] == "markdown" and top.startswith("**What this page's outputs come from.**"), stem
        words = " ".join(top.split())
        assert "random weights" in words and ("cannot" in words or "nothing about" in words), stem
        assert re.search(r"```sh\nmtnlg (eval|generate|job run) .*--checkpoint RUN_DIR|checkpoint RUN_DIR", top), stem
        assert "2201.11990" in words or stem == "13_generate", stem     # where the paper gives the study's figures
    top = "".join(json.loads((ROOT / "nbs" / "07_eval.ipynb").read_text())["cells"][1]["source"])
    assert paper_table_misses(top) == [] and top.count("\n| ") >= 6
    assert paper_table_misses(top.replace("| PIQA | 82.0 |", "| PIQA | 81.0 |")) == ["PIQA zero: 81.0 (mtnlg: 82.0)"]
