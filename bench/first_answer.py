"""Worker start-up inside the image: process start to its first answer, beside a bare echo loop.

    docker run --rm -i --entrypoint python3 IMAGE -S -c "$(cat bench/first_answer.py)" [RUNS]

Run inside the container (no Docker start in the figure, so far less noise than a cold run):
each sample spawns the interpreter, writes one request and times the answer. Printed as JSON.
"""

import json
import statistics
import subprocess
import sys
import time

ECHO = (
    "import os\n"
    "while True:\n"
    "    b = os.read(0, 65536)\n"
    "    if not b: break\n"
    '    os.write(1, b\'{"jsonrpc": "2.0", "result": "pong", "id": 1}\\n\')\n'
)
REQUESTS = {
    "ping": b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n',
    "run_python": b'{"jsonrpc": "2.0", "method": "run_python", "params": {"code": "pass"}, "id": 1}\n',
}


def once(argv, request):
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdin.write(request)
    p.stdin.flush()
    line = p.stdout.readline()
    ms = (time.perf_counter() - t) * 1000
    p.stdin.close()
    p.wait()
    assert line, "no answer"
    return ms


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    env_worker = [sys.executable, "-S", "-m", "toolcage.worker"]
    cases = {
        "echo_loop": ([sys.executable, "-S", "-c", ECHO], REQUESTS["ping"]),
        "worker_ping": (env_worker, REQUESTS["ping"]),
        "worker_run_python": (env_worker, REQUESTS["run_python"]),
    }
    samples = {k: [] for k in cases}
    for argv, req in cases.values():
        once(argv, req)  # warm the page cache
    for _ in range(runs):
        for name, (argv, req) in cases.items():
            samples[name].append(once(argv, req))
    out = {k: {"p50": round(statistics.median(v), 2), "min": round(min(v), 2)} for k, v in samples.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
