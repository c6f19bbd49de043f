"""Exit probe: which uses of mlx streams on extra threads let a process exit with status 0?

On the H200 every process that had made two or more overlap engines (each closed before the
next) ended with SIGABRT after its last line ("terminate called without an active exception",
exit 134); on the CPU a process whose thread holding an mlx stream still ran at exit aborted the
same way. mlx keeps a thread's streams in thread-local storage. This probe runs each case below in
a fresh Python process and records its exit status and the last line of its stderr:

* ``threads-joined N``: N threads one after another, each makes a stream, evaluates on it and is
  joined (what the engine's old per-engine prefill worker did);
* ``thread-alive``: one thread makes a stream and still runs (blocked) when the process exits;
* ``overlap N``: N overlap engines one after another (the engine's shared prefill thread), each
  run to completion and closed;
* ``plain N``: N engines without overlap (the control).

Usage::

    python -m probes.exit_probe --model tiny            # CPU
    bash scripts/h200.sh ... (see scripts/h200_batch.sh exit)

Writes ``data/results/<platform>/exit_probe.json``.
"""

from __future__ import annotations

import subprocess
import sys

from probes import common

THREADS = """
import sys, threading, mlx.core as mx
def work(ev=None):
    s = mx.new_stream(mx.default_device())
    with mx.stream(s):
        mx.eval(mx.ones((256, 256)) @ mx.ones((256, 256)))
    if ev is not None:
        ev.wait()
n, alive = int(sys.argv[1]), sys.argv[2] == "alive"
for _ in range(n):
    if alive:
        threading.Thread(target=work, args=(threading.Event(),), daemon=True).start()
    else:
        t = threading.Thread(target=work); t.start(); t.join()
import time; time.sleep(0.2)
print("last line")
"""

ENGINES = """
import sys
from mlxlab import load_model, Engine
model = load_model(sys.argv[3], bits=None if sys.argv[4] == "none" else int(sys.argv[4]))
for i in range(int(sys.argv[1])):
    with Engine(model, chunk_size=256, overlap=sys.argv[2] == "overlap") as eng:
        r = eng.submit([1 + i % 900 for i in range(2000)], 8)
        eng.run()
    assert r.done
print("last line")
"""

CASES = [("threads-joined", 1), ("threads-joined", 2), ("threads-joined", 3), ("thread-alive", 1),
         ("overlap", 1), ("overlap", 2), ("overlap", 3), ("plain", 2)]


def run_case(kind: str, n: int, args) -> dict:
    if kind.startswith("thread"):
        cmd = [sys.executable, "-c", THREADS, str(n), "alive" if kind == "thread-alive" else "joined"]
    else:
        cmd = [sys.executable, "-c", ENGINES, str(n), kind, args.model, str(args.bits) if args.bits else "none"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    err = [line for line in out.stderr.strip().splitlines() if line.strip()]
    row = {"case": kind, "n": n, "returncode": out.returncode, "printed_last_line": "last line" in out.stdout,
           "stderr_tail": err[-1][:200] if err else ""}
    common.log("exit probe", f"{kind:15s} x{n}: exit {out.returncode}  {row['stderr_tail']}")
    return row


def main(argv=None) -> int:
    args = common.parse(common.parser(__doc__, "exit_probe", model="tiny"), argv)
    rows = [run_case(kind, n, args) for kind, n in CASES]
    common.save(args, "exit_probe", {"model": args.model, "bits": args.bits, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
