"""Committed outputs against an execution on another CPU path: each notebook executed with torch's scalar kernels
(ATEN_CPU_CAPABILITY=default) and MKL's compatible path (MKL_CBWR=COMPATIBLE), as another machine's CPU sums, then
compared with its committed outputs exactly (character for character) and as the suite compares them (docs/build.py:
printed decimals to RTOL). Writes benchmarks/outputs_other_cpu.json.

    python benchmarks/outputs_other_cpu.py 04_pipeline 16_icl ...     # execute these now (a few minutes each)
    python benchmarks/outputs_other_cpu.py --executed DIR             # compare notebooks executed so into DIR
"""
import argparse, json, os, platform, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build          # docs/build.py
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stems", nargs="*")
    ap.add_argument("--executed", help="a folder of notebooks already executed on the other path (STEM.ipynb)")
    a = ap.parse_args()
    fresh = {}
    if a.executed: fresh = {p.stem: docs_build.read_nb(p) for p in sorted(Path(a.executed).glob("*.ipynb"))}
    for stem in a.stems: fresh[stem] = docs_build.execute(docs_build.NBS / f"{stem}.ipynb", env=OTHER_CPU)
    out = {}
    for stem, nb in sorted(fresh.items()):
        committed = docs_build.read_nb(docs_build.NBS / f"{stem}.ipynb")
        pairs = zip(docs_build.output_summary(committed), docs_build.output_summary(nb))
        out[stem] = {"cells_differing_exactly": [i + 1 for i, (x, y) in enumerate(pairs) if x[1] != y[1]],
                     "suite_comparison": docs_build.compare(stem, committed, nb) or "match"}
    record = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
              "other_cpu_path": OTHER_CPU, "rtol": docs_build.RTOL, "atol": docs_build.ATOL, "notebooks": out}
    (ROOT / "benchmarks" / "outputs_other_cpu.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))

if __name__ == "__main__": main()
