"""Notebooks executed as tests/test_notebooks.py executes them, in a fresh kernel and in one forked from the zygote
(docs/warm_kernel.py), alternating in one run: wall seconds and CPU seconds of the kernel (and what it started).

    python benchmarks/warm_kernels.py [STEM ...]      # writes benchmarks/warm_kernels.json

CPU of a fresh kernel: this process's reaped children; of a forked one: the zygote's reaped children (/proc)."""
import json, os, platform, resource, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build       # docs/build.py
import warm_kernel               # docs/warm_kernel.py

STEMS = sys.argv[1:] or ["00_config", "01a_placement", "02_topology", "05a_tokenizer", "09a_preflight", "15a_stats"]

def own_children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def zygote_children_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")     # cutime, cstime

def main():
    rows = []
    with warm_kernel.WarmKernels(docs_build.kernel_env()) as warm:
        assert warm.ready, warm.noise
        for stem in STEMS:
            nb = ROOT / "nbs" / f"{stem}.ipynb"
            for how in ("fresh", "warm"):
                t, own, zyg = time.time(), own_children_cpu(), zygote_children_cpu(warm.proc.pid)
                out = docs_build.execute(nb, timeout=1200, warm=warm if how == "warm" else None)
                wall = time.time() - t
                cpu = own_children_cpu() - own + zygote_children_cpu(warm.proc.pid) - zyg
                bad = docs_build.compare(stem, docs_build.read_nb(nb), out)
                rows.append({"notebook": stem, "kernel": how, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                             "outputs_match": not bad})
                print(rows[-1], flush=True)
    total = {how: {k: round(sum(r[k] for r in rows if r["kernel"] == how), 2) for k in ("wall_s", "cpu_s")}
             for how in ("fresh", "warm")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
              platform.machine(), "cores": os.cpu_count(), "load_1min_at_end": os.getloadavg()[0],
              "rows": rows, "total": total,
              "cpu_saved_per_notebook_s": round((total["fresh"]["cpu_s"] - total["warm"]["cpu_s"]) / len(STEMS), 2)}
    (ROOT / "benchmarks" / "warm_kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["total"]), "CPU saved per notebook:", result["cpu_saved_per_notebook_s"], "s")

if __name__ == "__main__":
    main()
