"""One job on the host: its state, its detached start, its graceful stop (runs ON the host).

A job lives in its folder `<remote_dir>/jobs/<job>/`: `job.json` (what was launched),
`pid`, `log`, `status.json` (written by the payload), its outputs and, for a generator in
batch mode, its batch ledger `batches.json` (counted as `ledger`: `fab stop` cancels the
live batches of a job whose process is gone). `op` picks what to
do; every op answers with the job's state as `state` reads it, so a start or a stop costs
one round trip including the check that follows it.

- `state`: status.json, job.json, the pid and whether it is alive: alive means the pid
  exists, is not a zombie and its command line names the job folder (a pid reused by an
  unrelated process is not the job). `keys` lists files whose presence to report (the
  placed API key), `records` small JSON files to return (the minted key's record).
- `start`: `mkdir -p` (0700; the job's files are made under umask 077, so 0600), job.json,
  then the command under `sh -c 'exec nohup …'` in a new
  session (setsid), stdin from /dev/null and stdout/stderr appended to `log`, so it
  survives the SSH session and never waits on input; its pid goes to `pid`. It then
  watches ~1 s to catch a command that dies at once (a bad flag, a missing file); a launch
  of several jobs starts each with `watch_s` 0 and then watches them all at once (`check`:
  one wait, each job's state, the log's tail of any that is no longer alive).
- `stop`: SIGTERM to the job's pid when alive, then waits up to `timeout` s for it to
  exit: the payload drains its in-flight requests and stays resumable. With `now`, a
  second SIGTERM `NOW_GAP_S` later: the payload then closes its requests in flight at once
  (`fab stop --now`). `stop_all` does so for every running job under `jobs_dir` at once
  (`fab stop` without `--job`).
- `running`: every job under `jobs_dir` whose process is alive (cleanup-secrets warns
  before removing the key under one).
- `forget`: remove the job's folder, only when its process is not alive (`fab forget`: a
  finished or abandoned job no longer counted by `status`); answers what it found.
- `list`: every job under `jobs_dir` (each one's state as `state` reads it), plus the
  `keys` and `records` of `state`: `fab status`, `stop`, `logs` without `--job` and the
  launch's checks of several jobs read a host in this one round trip. With `metrics`
  (job -> the byte offset read so far, or None), each job also gets the whole lines its
  `metrics.jsonl` gained since (`fab report --watch`: one round trip a refresh), at most
  METRICS_BYTES for all jobs together: a first read (or one that fell behind) takes the
  file's end.

With `latency` (`fab status`), `state` and `list` add each job's `latency`: a histogram of
its answers' `latency_s` (`{"bins": {i: n}, "n": answers}`, bin i holding the latencies
nearest LATENCY_RATIO**i seconds, so 1% off at most), read from `output.jsonl`
incrementally: `.latency.tmp-cache` in the job folder keeps the histogram and how far the
file was read (its device:inode and the offset after its last whole line), so a status reads
only the lines written since the last one (the first one of a 1 GB output: ~0.5 s). A
record's `latency_s` is its top-level one, which the payload writes just before `attempts`
(`--turns all`: the turns' own come earlier in the line, the record's sum last).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

START_WATCH_S = 1.0  # how long a fresh start is watched for an instant crash
LOG_TAIL_LINES = 15
METRICS_BYTES = 2 << 20  # metrics.jsonl text per answer, all jobs together
LATENCY_RATIO = 1.02  # a histogram bin's width: latencies within 1% of its value
LATENCY_RANGE = (1e-3, 1e5)  # seconds; outside: counted in the first or last bin
LATENCY_CACHE = ".latency.tmp-cache"  # a temp name: fetch never lists it
_LATENCY = b'"latency_s":'


def expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def load_json(path: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except Exception:
        return None


def read_pid(job_dir: str) -> int | None:
    try:
        with open(os.path.join(job_dir, "pid")) as fh:
            return int(fh.read().strip())
    except Exception:
        return None


def is_alive(pid: int, job_dir: str) -> bool:
    """The job's process still runs: not gone, not a zombie, not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else: cannot look closer
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if job_dir.encode() not in fh.read():
                return False  # the pid was reused by an unrelated process
    except OSError:
        pass  # no /proc: kill -0 is all we know
    return True


def batch_ledger(job_dir: str) -> dict[str, Any] | None:
    """The generator's batch ledger (`batches.json`, `generate --mode batch`), counted: its
    batches, the live ones (submitted, or uploaded: a submission whose answer was lost may
    have made one; not collected yet, so they may still run at the provider) and their
    requests; None when the job has none."""
    ledger = load_json(os.path.join(job_dir, "batches.json"))
    if not isinstance(ledger, dict) or not isinstance(ledger.get("batches"), list):
        return None
    live = [b for b in ledger["batches"]
            if isinstance(b, dict) and b.get("step") in ("submitted", "uploaded")]
    return {"batches": len(ledger["batches"]), "live": len(live),
            "live_requests": sum(b.get("requests") or 0 for b in live
                                 if isinstance(b.get("requests"), int))}


def job_state(job_dir: str) -> dict[str, Any]:
    pid = read_pid(job_dir)
    return {
        "job_dir": job_dir,
        "status": load_json(os.path.join(job_dir, "status.json")),
        "meta": load_json(os.path.join(job_dir, "job.json")),
        "pid": pid,
        "alive": bool(pid) and is_alive(pid, job_dir),  # type: ignore[arg-type]
        "ledger": batch_ledger(job_dir),
    }


def host_keys(a: dict[str, Any]) -> dict[str, Any]:
    # By absolute path: `~/…` (the host's key_path) and the ledger's absolute path of the
    # same file are one entry.
    return {"keys": {expand(p): os.path.exists(expand(p)) for p in a.get("keys", [])},
            "records": {p: load_json(expand(p)) for p in a.get("records", [])}}


def latency_bin(seconds: float) -> int:
    import math

    low, high = LATENCY_RANGE
    return round(math.log(min(max(seconds, low), high)) / math.log(LATENCY_RATIO))


def latency(job_dir: str) -> dict[str, Any] | None:
    """The histogram of the answers' latency_s in the job's output.jsonl, brought up to date
    from where the cache left off (see the module's docstring); None without an output."""
    import mmap
    import re

    path = os.path.join(job_dir, "output.jsonl")
    try:
        st = os.stat(path)
    except OSError:
        return None
    file = f"{st.st_dev}:{st.st_ino}"
    cached = load_json(os.path.join(job_dir, LATENCY_CACHE))
    bins: dict[str, int] = {}
    offset = n = 0
    if (isinstance(cached, dict) and cached.get("file") == file and isinstance(cached.get("bins"), dict)
            and isinstance(cached.get("offset"), int) and 0 <= cached["offset"] <= st.st_size):
        bins, offset, n = cached["bins"], cached["offset"], int(cached.get("n") or 0)
    if st.st_size > offset:
        pattern = re.compile(rb'"latency_s":\s*(-?[0-9][0-9.eE+-]*)\s*,\s*"attempts":')
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), st.st_size, access=mmap.ACCESS_READ) as mm:
            pos, find, rfind, match = offset, mm.find, mm.rfind, pattern.match
            while True:
                end = find(b"\n", pos)
                if end < 0:
                    break  # a line still being written: read when it is whole
                i = rfind(_LATENCY, pos, end)
                while i >= 0:
                    m = match(mm, i)
                    if m is not None:
                        try:
                            key = str(latency_bin(float(m.group(1))))
                        except ValueError:
                            break
                        bins[key] = bins.get(key, 0) + 1
                        n += 1
                        break
                    i = rfind(_LATENCY, pos, i)
                pos = end + 1
        if pos != offset:
            offset = pos
            tmp = os.path.join(job_dir, f"{LATENCY_CACHE}-{os.getpid()}")
            try:
                old = os.umask(0o077)
                try:
                    with open(tmp, "w") as out:
                        out.write(json.dumps({"file": file, "offset": offset, "n": n, "bins": bins}))
                finally:
                    os.umask(old)
                os.replace(tmp, os.path.join(job_dir, LATENCY_CACHE))
            except OSError:  # a full disk: the next status reads these lines again
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
    return {"bins": bins, "n": n}


def with_latency(current: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    if a.get("latency"):
        current["latency"] = latency(current["job_dir"])
    return current


def own_key(current: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """The job's own key (a job with a budget: `<job_keys>/<job>.key`): there or not, and
    the record beside it."""
    folder = a.get("job_keys")
    if folder:
        path = os.path.join(expand(folder), os.path.basename(current["job_dir"]) + ".key")
        current["own_key"] = {"path": path, "exists": os.path.exists(path),
                              "record": load_json(path + ".minted.json")}
    return current


def state(a: dict[str, Any]) -> dict[str, Any]:
    return {**own_key(with_latency(job_state(expand(a["job_dir"])), a), a), **host_keys(a)}


def job_names(jobs_dir: str) -> list[str]:
    """The job folders under `jobs_dir` (temp and hidden names left out), sorted."""
    try:
        names = sorted(os.listdir(jobs_dir))
    except OSError:
        return []
    return [n for n in names if not n.startswith(".") and os.path.isdir(os.path.join(jobs_dir, n))]


def metrics_since(job_dir: str, start: int | None, budget: int) -> dict[str, Any] | None:
    """The whole lines of the job's metrics.jsonl after byte `start` (None: its last
    `budget` bytes), as {"from", "to", "text"}; None without the file."""
    try:
        with open(os.path.join(job_dir, "metrics.jsonl"), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if start is None or start > size or size - start > budget:
                start, skip = max(0, size - budget), size > budget
            else:
                skip = False
            fh.seek(start)
            data = fh.read(min(budget, size - start))
    except (OSError, ValueError):
        return None
    if skip:  # began inside a line: from the next one
        nl = data.find(b"\n") + 1
        data, start = data[nl:], start + nl
    data = data[:data.rfind(b"\n") + 1]  # a line still being written comes next time
    return {"from": start, "to": start + len(data), "text": data.decode("utf-8", "replace")}


def list_jobs(a: dict[str, Any]) -> dict[str, Any]:
    jobs_dir = expand(a["jobs_dir"])
    names = job_names(jobs_dir)
    jobs = {name: own_key(with_latency(job_state(os.path.join(jobs_dir, name)), a), a)
            for name in names}
    offsets = a.get("metrics")
    if isinstance(offsets, dict):
        budget = METRICS_BYTES // max(1, len(names))
        for name in names:
            jobs[name]["metrics"] = metrics_since(os.path.join(jobs_dir, name), offsets.get(name),
                                                  budget)
    return {"jobs_dir": jobs_dir, "jobs": jobs, **host_keys(a)}


def log_tail(job_dir: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(os.path.join(job_dir, "log"), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def start(a: dict[str, Any]) -> dict[str, Any]:
    import subprocess

    job_dir = expand(a["job_dir"])
    # The job's data is the login user's alone: its folders 0700, its files 0600, the
    # payload's outputs included (it inherits the umask).
    os.umask(0o077)
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    os.chmod(job_dir, 0o700)  # also a folder an older handoff made 0755
    os.chmod(os.path.dirname(job_dir), 0o700)
    # job.json binds the job to its input (sha256): replaced whole, never left torn.
    meta_tmp = os.path.join(job_dir, f".job.json.tmp-{os.getpid()}")
    with open(meta_tmp, "w") as fh:
        fh.write(json.dumps(a["meta"]) + "\n")
    os.replace(meta_tmp, os.path.join(job_dir, "job.json"))
    with open(os.path.join(job_dir, "log"), "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(["sh", "-c", "exec nohup " + a["command"]], cwd=job_dir,
                                stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    with open(os.path.join(job_dir, "pid"), "w") as fh:
        fh.write(f"{proc.pid}\n")
    deadline = time.monotonic() + float(a.get("watch_s", START_WATCH_S))
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    result = {"pid": proc.pid, "started": proc.poll() is None, "exit": proc.returncode}
    if not result["started"]:
        result["log_tail"] = log_tail(job_dir)
    result["state"] = state(a)
    return result


def check(a: dict[str, Any]) -> dict[str, Any]:
    """After starting several jobs without watching each (`start` with `watch_s` 0): wait
    `watch_s` once, then each job's state, with its log's tail when it is no longer alive."""
    time.sleep(float(a.get("watch_s", START_WATCH_S)))
    jobs_dir = expand(a["jobs_dir"])
    out = {}
    for name in a.get("jobs", []):
        job_dir = os.path.join(jobs_dir, name)
        current = job_state(job_dir)
        if not current["alive"]:
            current["log_tail"] = log_tail(job_dir)
        out[name] = current
    return {"jobs": out}


# `now`: the gap between the two SIGTERMs, so that the job's handler has taken the first
# (two signals pending at once would be one).
NOW_GAP_S = 0.5


def terminate(jobs: list[tuple[int, str]], now: bool) -> None:
    """SIGTERM each (pid, job_dir); with `now`, once more after NOW_GAP_S to those alive."""
    for pid, _ in jobs:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if not now or not jobs:
        return
    time.sleep(NOW_GAP_S)
    for pid, job_dir in jobs:
        if is_alive(pid, job_dir):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def stop(a: dict[str, Any]) -> dict[str, Any]:
    before = state(a)
    if not before["alive"]:
        return {"was_alive": False, "drained": True, "state": before}
    pid, job_dir = int(before["pid"]), before["job_dir"]
    terminate([(pid, job_dir)], bool(a.get("now")))
    deadline = time.monotonic() + float(a.get("timeout", 60))
    while is_alive(pid, job_dir) and time.monotonic() < deadline:
        time.sleep(0.25)
    return {"was_alive": True, "pid": pid, "drained": not is_alive(pid, job_dir),
            "state": state(a)}


def stop_all(a: dict[str, Any]) -> dict[str, Any]:
    """`stop` for every running job under `jobs_dir`: SIGTERM each, then one shared wait."""
    jobs_dir = expand(a["jobs_dir"])
    alive = {}
    for name in job_names(jobs_dir):
        job_dir = os.path.join(jobs_dir, name)
        pid = read_pid(job_dir)
        if pid and is_alive(pid, job_dir):
            alive[name] = (pid, job_dir)
    terminate(list(alive.values()), bool(a.get("now")))
    deadline = time.monotonic() + float(a.get("timeout", 60))
    while any(is_alive(p, d) for p, d in alive.values()) and time.monotonic() < deadline:
        time.sleep(0.25)
    idle = [n for n in job_names(jobs_dir) if n not in alive]
    # Idle jobs whose batch ledger names live batches: fab stop cancels them.
    batches = {}
    for name in idle:
        ledger = batch_ledger(os.path.join(jobs_dir, name))
        if ledger and ledger.get("live"):
            batches[name] = job_state(os.path.join(jobs_dir, name))
    return {"jobs": {name: {"pid": pid, "drained": not is_alive(pid, job_dir),
                            "state": job_state(job_dir)} for name, (pid, job_dir) in alive.items()},
            "idle": idle, "batches": batches}


def running(a: dict[str, Any]) -> dict[str, Any]:
    jobs_dir = expand(a["jobs_dir"])
    alive = []
    for name in job_names(jobs_dir):
        job_dir = os.path.join(jobs_dir, name)
        pid = read_pid(job_dir)
        if pid and is_alive(pid, job_dir):
            alive.append({"job": name, "pid": pid})
    return {"running": alive}


def forget(a: dict[str, Any]) -> dict[str, Any]:
    before = state(a)
    job_dir = before["job_dir"]
    if before["alive"]:
        return {"removed": False, "alive": True, "state": before}
    if not os.path.isdir(job_dir):
        return {"removed": False, "alive": False, "state": before}
    # Renamed first so a half-finished removal leaves a hidden name, never a half job.
    gone = os.path.join(os.path.dirname(job_dir), f".forget-{os.path.basename(job_dir)}-{os.getpid()}")
    os.rename(job_dir, gone)
    shutil.rmtree(gone, ignore_errors=True)
    return {"removed": True, "alive": False, "state": before}


OPS = {"state": state, "forget": forget, "start": start, "check": check, "stop": stop, "stop_all": stop_all,
       "running": running, "list": list_jobs}


def main(argv: list[str]) -> int:
    args = eval(argv[1], {"__builtins__": {}})
    print(json.dumps(OPS[args["op"]](args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
