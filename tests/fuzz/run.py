#!/usr/bin/python3
"""Runs Ferry's fuzz targets, each for a given time, and reports what they did.

    run.py --build-dir build-fuzz --seconds 600 [--jobs N] [--json FILE] [TARGET...]

No TARGET: every target. C++ targets are libFuzzer binaries in the build dir;
each starts from its seeds (tests/fuzz/corpus/<name>, read only) and what earlier
runs found (<build-dir>/fuzz-corpus/<name>), and leaves any crashing input in
<build-dir>/fuzz-artifacts/. fuzz_tensor_header is the Python mutation fuzzer
(tensor_header_fuzz.py). Prints a table, writes the report as JSON when asked
(executions, exec/s, coverage and features from libFuzzer's final stats, new
inputs, crashes), and exits non-zero if any target crashed or would not run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CXX_TARGETS = ["fuzz_frame_header", "fuzz_frame_stream", "fuzz_handshake", "fuzz_descriptor",
               "fuzz_attach", "fuzz_master"]
PY_TARGET = "fuzz_tensor_header"

_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def run_cxx(name: str, build_dir: str, seconds: int) -> dict:
    binary = os.path.join(build_dir, "tests", "fuzz", name)
    if not os.access(binary, os.X_OK):
        return {"target": name, "ok": False, "error": f"{binary} is not built"}
    work = os.path.join(build_dir, "fuzz-corpus", name)
    artifacts = os.path.join(build_dir, "fuzz-artifacts")
    os.makedirs(work, exist_ok=True)
    os.makedirs(artifacts, exist_ok=True)
    seeds = os.path.join(HERE, "corpus", name)
    cmd = [binary, f"-max_total_time={seconds}", "-print_final_stats=1", "-timeout=30",
           "-rss_limit_mb=4096", f"-artifact_prefix={artifacts}/{name}-", work]
    if os.path.isdir(seeds):
        cmd.append(seeds)
    env = dict(os.environ)
    # A leak report at exit would count as a crash; the targets keep their
    # servers for the whole run on purpose.
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    start = time.monotonic()
    # Generous: the run itself is bounded by -max_total_time.
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=env, timeout=seconds + 300)
    out = proc.stdout
    result = {"target": name, "seconds": round(time.monotonic() - start, 1),
              "ok": proc.returncode == 0}
    for line in out.splitlines():
        m = _STATUS.match(line)
        if m:
            result.update(runs=int(m[1]), cov=int(m[2]), ft=int(m[3]), corpus=int(m[4]))
        m = _STAT.match(line)
        if m:
            result[m[1]] = int(m[2])
        m = _ARTIFACT.search(line)
        if m:
            result["artifact"] = m[1]
    if "number_of_executed_units" in result:
        result["runs"] = result.pop("number_of_executed_units")
    if "average_exec_per_sec" in result:
        result["execs_per_sec"] = result.pop("average_exec_per_sec")
    if not result["ok"]:
        tail = out.splitlines()[-40:]
        result["error"] = "\n".join(tail)
        sys.stderr.write(f"--- {name} failed (exit {proc.returncode}):\n" + "\n".join(tail) +
                         "\n")
    return result


def run_python(seconds: int) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(HERE, "tensor_header_fuzz.py"),
                           "--seconds", str(seconds), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=seconds + 300)
    result = {"target": PY_TARGET, "seconds": round(time.monotonic() - start, 1),
              "ok": proc.returncode == 0}
    try:
        result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        pass
    if not result["ok"]:
        result["error"] = proc.stderr[-4000:]
        sys.stderr.write(f"--- {PY_TARGET} failed:\n{proc.stderr[-4000:]}\n")
    return result


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-fuzz"))
    ap.add_argument("--seconds", type=int, default=60, help="per target")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--jobs", type=int, default=1,
                    help="targets run at once (each takes one core)")
    ap.add_argument("targets", nargs="*", help=f"default: all of {CXX_TARGETS + [PY_TARGET]}")
    args = ap.parse_args()
    targets = args.targets or CXX_TARGETS + [PY_TARGET]
    unknown = [t for t in targets if t not in CXX_TARGETS + [PY_TARGET]]
    if unknown:
        ap.error(f"unknown targets {unknown}")

    commit = git_commit()  # now: the tree may move on while the targets run

    def one(t: str) -> dict:
        print(f"fuzz: {t} for {args.seconds} s", flush=True)
        if t == PY_TARGET:
            return run_python(args.seconds)
        return run_cxx(t, os.path.abspath(args.build_dir), args.seconds)

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, targets))

    print(f"{'target':<22} {'runs':>11} {'exec/s':>8} {'cov':>6} {'ft':>7} {'corpus':>7}  result")
    for r in results:
        print(f"{r['target']:<22} {r.get('runs', 0):>11} {r.get('execs_per_sec', 0):>8} "
              f"{r.get('cov', '-'):>6} {r.get('ft', '-'):>7} {r.get('corpus', '-'):>7}  "
              f"{'ok' if r['ok'] else 'FAILED ' + r.get('artifact', '')}")
    if args.json:
        report = {
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "machine_note": f"{os.cpu_count()} cores",
            "seconds_per_target": args.seconds,
            "jobs": args.jobs,
            "targets": results,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"fuzz: report in {args.json}")
    failed = sum(not r["ok"] for r in results)
    print(f"fuzz: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
