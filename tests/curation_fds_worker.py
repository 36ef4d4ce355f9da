"""Run in a child process under a low open-files limit: a curation's stages, or the old merge's way of opening parts."""
import json, resource, sys, time
from pathlib import Path


def main(out: str, mode: str, limit: int):
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from mtnlg.curation import CurationRun, run_local
    from mtnlg.curation_steps import open_files
    run = CurationRun(**{k: v for k, v in json.loads((Path(out) / "run.json").read_text()).items()
                         if k in CurationRun.__dataclass_fields__} | {"out": out})
    t0, fds = time.time(), {}
    if mode == "executor":        # datatrove's LocalPipelineExecutor, one worker (the tasks in this process)
        run_local(run, workers=1, log=None)
        fds["end"] = open_files()
    elif mode == "old_merge":       # what the old merge held for a source: every part's .bin/.idx and its jsonl
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        held = []
        for s in run.sources:
            try:
                for idx in sorted((Path(out) / "work/parts" / s.name).glob("*.idx")):
                    held.append((IndexedDataset(str(idx.with_suffix(""))), open(idx.with_suffix(".jsonl"))))
            except OSError as e:
                print(json.dumps({"source": s.name, "parts_opened": len(held), "error": str(e)}))
                sys.exit(1)
            fds[s.name] = open_files()
    print(json.dumps({"seconds": round(time.time() - t0, 2), "open_files_max": fds}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
