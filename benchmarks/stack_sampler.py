"""A sampling profiler for every Python process a test starts: a thread that records the main thread's stack
every 0.2 s and writes {argv, wall, CPU seconds, stacks: counts} to $STACK_SAMPLES_DIR/<pid>.json (every 5 s and
at exit, so a killed rank leaves what it had). To profile a test's processes (its workers, launched ranks), import
it from the sitecustomize the suite puts on every child's path, for that run only:

    echo "import sys; sys.path.insert(0, '$PWD/benchmarks'); import stack_sampler" >> tests/strict/sitecustomize.py
    STACK_SAMPLES_DIR=/tmp/samples .venv/bin/python -m pytest tests/test_studies.py -p no:cacheprovider
    git checkout tests/strict/sitecustomize.py
    .venv/bin/python benchmarks/stack_shares.py /tmp/samples OUT.json

Wall samples, not CPU: on a loaded machine a waiting process and a starved one look alike; compare shares within
a process, and CPU seconds (`cpu`) across processes."""
import collections, json, os, sys, threading, time

DIR = os.environ.get("STACK_SAMPLES_DIR")
INTERVAL = 0.2


def _start(folder: str) -> None:
    counts, t0, pid = collections.Counter(), time.time(), os.getpid()

    def dump():
        path = f"{folder}/{pid}.json"
        with open(path + ".tmp", "w") as f:
            json.dump(dict(argv=sys.argv, t0=t0, t1=time.time(), cpu=time.process_time(), interval=INTERVAL,
                           stacks=[[k, v] for k, v in counts.items()]), f)
        os.replace(path + ".tmp", path)

    def sample():
        main, n = threading.main_thread().ident, 0
        while True:
            time.sleep(INTERVAL)
            n += 1
            frame, stack = sys._current_frames().get(main), []
            while frame is not None and len(stack) < 60:
                code = frame.f_code
                stack.append(f"{code.co_filename.split('site-packages/')[-1]}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            counts["|".join(reversed(stack))] += 1
            if n % 25 == 0: dump()

    threading.Thread(target=sample, daemon=True).start()
    import atexit
    atexit.register(dump)


if DIR: _start(DIR)
