"""Where the docs tests' fixtures spend their time (tests/test_docs.py): the site's build (the API pages' imports and
the staging in this process, mkdocs in its own) and the survey of every page in headless chromium, surveyed twice
in one run: as the suite did before (each page loading the site's 2.7 MB search index into Material's search worker,
which builds its lunr index and is dropped at the next page) and as it does now (the index blocked: what the survey
reads needs no search). CPU seconds are this process's and its waited children's (mkdocs, chromium and its
renderers); both surveys must find the same thing on every page.

    .venv/bin/python benchmarks/docs_survey.py    # writes benchmarks/docs_survey.json
"""
import functools, http.server, json, os, resource, shutil, sys, tempfile, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "docs")]
import build as docs_build                  # docs/build.py
import test_docs                            # tests/test_docs.py: its Browser, survey and what it does not load

def cpu():
    "(this process's CPU seconds, its waited children's)."
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

class TreeCPU:
    """CPU seconds of process `pid` and its descendants, sampled from /proc every 0.2 s (chromium's renderers exit
    unwaited by us: getrusage never sees them); a process's last 0.2 s before it exits can be missed."""
    def __init__(self, pid):
        self.pid, self.seen, self.stop = pid, {}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True); self.thread.start()
    def sample(self):
        stats = {}
        for d in os.listdir("/proc"):
            if not d.isdigit(): continue
            try: f = open(f"/proc/{d}/stat").read()
            except OSError: continue
            rest = f[f.rindex(")") + 2:].split()
            stats[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK"))
        tree, grew = {self.pid}, True
        while grew:
            new = {p for p, (pp, _) in stats.items() if pp in tree} - tree
            tree |= new; grew = bool(new)
        for p in tree:
            if p in stats: self.seen[p] = max(self.seen.get(p, 0), stats[p][1])
    def run(self):
        while not self.stop.wait(0.2): self.sample()
    def total(self):
        self.sample(); self.stop.set(); self.thread.join(); return round(sum(self.seen.values()), 1)

def measured(fn):
    "fn()'s value, wall seconds, own CPU seconds, children's CPU seconds."
    (s0, c0), t = cpu(), time.time()
    v = fn()
    (s1, c1) = cpu()
    return v, round(time.time() - t, 1), round(s1 - s0, 1), round(c1 - c0, 1)

def main():
    tmp = Path(tempfile.mkdtemp(prefix="docs-survey-"))
    out = {"machine": "2-core AMD EPYC KVM, shared", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    _, *out["import mtnlg's modules (API pages)"] = measured(lambda: [__import__(m, fromlist=["x"])
                                                                      for m in docs_build.modules()])
    _, *out["site build (stage + mkdocs)"] = measured(lambda: docs_build.build(tmp / "site", "none", work=tmp / "w"))
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
    handler = functools.partial(Quiet, directory=str(tmp / "site"))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    served = f"http://127.0.0.1:{srv.server_address[1]}/"
    exe = test_docs.chromium_binary()
    surveys = {}
    for name, blocked in (("survey, search index loaded on each page (before)", []),
                          ("survey, search index blocked (now)", test_docs.NO_SEARCH_INDEX)):
        prof = tmp / f"profile-{len(surveys)}"; prof.mkdir()
        def run():
            b = test_docs.Browser(exe, prof)
            b.call("Network.enable"); b.call("Network.setBlockedURLs", urls=blocked)     # as the browser fixture
            cpu_of = TreeCPU(b.proc.pid)
            try: return test_docs.survey_pages(b, tmp / "site", served), cpu_of.total()
            finally: b.close()
        (surveys[name], chromium), *out[name] = measured(run)
        out[name].append(chromium)
    srv.shutdown()
    a, b = surveys.values()
    out["pages"] = len(a)
    out["same findings on every page"] = a == b
    print(json.dumps(out, indent=1))
    out["columns"] = ["wall s", "this process's CPU s", "waited children's CPU s (mkdocs; chromium's main process)",
                      "chromium's process tree's CPU s (sampled from /proc)"]
    (ROOT / "benchmarks" / "docs_survey.json").write_text(json.dumps(out, indent=1) + "\n")
    shutil.rmtree(tmp)
    if a != b: print({k: (a[k], b[k]) for k in a if a[k] != b.get(k)}, file=sys.stderr); return 1
    return 0

if __name__ == "__main__": sys.exit(main())
