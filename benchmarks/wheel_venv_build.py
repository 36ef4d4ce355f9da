"""The wheel test's venv of one stack (tests/test_package.py `make_venv`) made cold both ways, one after the other in one
run: pip-installed (torch and megatron-core, then the wheel with the lock as constraints) and cloned from the
developer's venv of the stack (hard links), each followed by the same pruning and `pip check`. Seconds, the load
average around each, files and bytes written (benchmarks/wheel_venv_files.py's count).
Usage: python benchmarks/wheel_venv_build.py [STACK (oldest)] [OUT.json]   (needs the developer's venv of STACK)"""
import json, os, shutil, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
import test_package as T                                   # noqa: E402  (tests/ on the path first)
from wheel_venv_files import count                         # noqa: E402

if __name__ == "__main__":
    stack = sys.argv[1] if len(sys.argv) > 1 else "oldest"
    version, lock, _ = T.STACKS[stack]
    src = T.dev_venv(stack)
    assert src, f"no developer venv of {stack} ({T.DEV_VENVS[stack]}) with the lock's torch and megatron-core"
    work = ROOT / ".build" / "bench-venv"                   # beside .venv: hard links need one file system
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "src").mkdir(); (tmp / "out").mkdir()
    wheel = T.build_wheel(tmp / "src", tmp / "out")
    result = {"stack": stack, "lock": lock, "source": str(src)}
    for way, source in (("pip", None), ("clone", src)):
        venv = work / f"venv-{way}"
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        T.make_venv(stack, venv, wheel, source)
        seconds, load1 = time.perf_counter() - t0, os.getloadavg()[0]
        checks = {"unowned": T.unowned(venv, version), "off_lock": T.off_lock(venv, version, lock)}
        result[way] = {"seconds": round(seconds, 1), "load_before": load0, "load_after": load1, **count(venv), **checks}
        shutil.rmtree(venv)
    shutil.rmtree(work); shutil.rmtree(tmp)
    result["ratio_clone_to_pip"] = round(result["clone"]["seconds"] / result["pip"]["seconds"], 3)
    text = json.dumps(result, indent=1)
    print(text)
    if len(sys.argv) > 2: Path(sys.argv[2]).write_text(text + "\n")
