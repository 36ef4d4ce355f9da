"""What the wheel test's venvs (.build/pkgtest/venv-*, tests/test_package.py) hold: files and bytes, and of them how
many are hard links shared with another venv (the developer's, when `fresh_venv` cloned it) rather than written.
Usage: python benchmarks/wheel_venv_files.py [OUT.json]   (prints the JSON; writes it to OUT.json when given)"""
import json, os, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def count(venv: Path) -> dict:
    "Files, bytes, and the files/bytes shared by hard link (st_nlink > 1), symlinks not followed."
    files = size = linked = linked_size = 0
    for d, _, names in os.walk(venv):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if not os.path.isfile(os.path.join(d, n)) or os.path.islink(os.path.join(d, n)): continue
            files += 1; size += st.st_size
            if st.st_nlink > 1: linked += 1; linked_size += st.st_size
    return {"files": files, "bytes": size, "hard_linked_files": linked, "hard_linked_bytes": linked_size,
            "written_bytes": size - linked_size}


if __name__ == "__main__":
    out = {v.name: count(v) for v in sorted((ROOT / ".build" / "pkgtest").glob("venv-*"))}
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1: Path(sys.argv[1]).write_text(text + "\n")
