"""The fleet is not trusted either (issue 31): every test here plays, on real sshd and the
project's fake OpenRouter with its `/keys`, a host acting against other hosts, against the
budget over time, against the workstation's resources or against later commands; and a
colleague's inventory or input file that is hostile.

Asserted outcomes, never mechanisms: at most one live child key per host, whatever the host
does with its files; a cleanup reported clean leaves no live key, with the state dir gone
too; no record of one host's shard taken from another host; no completeness claimed for
shards never seen; nothing run on the workstation from an address; no request carrying the
management key to any URL but the inventory's management API; peak RSS and the disk bounded;
a stalled host never holding the others; no traceback; a non-zero exit naming the host
wherever something was refused.

One test per finding of the issue (its number in each docstring).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from handoff.defaults import BUILTIN_VARS
from tests.integration.conftest import explain, key_file, remote_dir, run_as
from tests.integration.test_hostile_container import (
    EvilAPI,
    fab_rss,
    job_dir,
    no_traceback,
    plant_python,
    prompts,
    record_path,
    set_host_vars,
    write_as,
)

LIMIT = 5.0


def minted(make_sandbox: Any, hosts: int, **kwargs: Any) -> Any:
    return make_sandbox(hosts=hosts, management=True, key_limit=LIMIT, **kwargs)


def flat(result: Any) -> str:
    return " ".join(result.text.split())


def key_answers(sbx: Any, key: str) -> int:
    """What the API answers `GET /key` with this key (200: it lives, 401: it is dead)."""
    request = urllib.request.Request(f"{sbx.api_url}/key",
                                     headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def stash_key(c: Any, name: str) -> str:
    """The host copies its placed key elsewhere in its home (a key it means to keep)."""
    stash = Path(c.home) / "stash"
    run_as(c, "mkdir", "-p", str(stash))
    run_as(c, "cp", str(key_file(c)), str(stash / name))
    return key_file(c).read_text()


def launched(sbx: Any, fab: Any, tmp_path: Path, n: int, job: str = "p") -> Path:
    """Deploy, launch one sharded job of `n` prompts over every host, wait for it."""
    assert fab.on(sbx, "deploy").rc == 0
    data = prompts(tmp_path / f"{job}.jsonl", n)
    launch = fab.on(sbx, "launch", "--input", str(data))
    assert launch.rc == 0, explain(launch)
    waited = fab.on(sbx, "status", "--wait", "--interval", "0.5", timeout=180)
    assert waited.rc == 0, explain(waited)
    return data


# -- 1. one live child key per host ------------------------------------------------------------------

def test_a_host_never_holds_two_live_child_keys(make_sandbox, fab) -> None:
    """Finding 1: copy the placed key away, delete `<key_path>.minted.json`, wait for the next
    push-key, three times, then once more with the workstation's state dir gone: a new key
    is minted each time and the old one must die first."""
    sbx = minted(make_sandbox, 1)
    c = sbx.container("sbx-1")
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    stashed = []
    runs = []
    for i in range(3):
        stashed.append(stash_key(c, f"key{i}"))
        record_path(c).unlink()
        runs.append(fab.on(sbx, "push-key"))
        assert runs[-1].rc == 0, explain(runs[-1])
        assert len(sbx.api.keys.live()) == 1, f"round {i}: {len(sbx.api.keys.live())} live keys"
    assert [key_answers(sbx, key) for key in stashed] == [401, 401, 401]
    assert key_answers(sbx, key_file(c).read_text()) == 200  # the one placed now works
    assert "revoked its earlier child key" in flat(runs[0]), explain(runs[0])
    # Once more with the state dir gone (another clone, a new workstation id): the API's own
    # list names the host's key, and it dies before the next one is minted.
    stashed.append(stash_key(c, "key3"))
    record_path(c).unlink()
    shutil.rmtree(sbx.state_dir)
    runs.append(fab.on(sbx, "push-key"))
    assert runs[-1].rc == 0, explain(runs[-1])
    assert len(sbx.api.keys.live()) == 1 and key_answers(sbx, stashed[-1]) == 401, explain(runs[-1])
    no_traceback(deploy, *runs)


# -- 2. a cleanup with an empty state dir finds the keys at the API --------------------------------

def test_cleanup_with_an_empty_state_dir_revokes_what_the_api_lists(make_sandbox, fab) -> None:
    """Finding 2: the host keeps a copy of its key and deletes the file and its record; the
    workstation's state dir is wiped (another clone): the API's own key list still names the
    key, and cleanup must revoke it, not report "already absent" while it lives."""
    sbx = minted(make_sandbox, 1)
    c = sbx.container("sbx-1")
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    kept = stash_key(c, "kept")
    key_file(c).unlink()
    record_path(c).unlink()
    shutil.rmtree(sbx.state_dir)

    cleanup = fab.on(sbx, "cleanup-secrets")

    assert sbx.api.keys.live() == [], explain(cleanup)
    assert key_answers(sbx, kept) == 401, explain(cleanup)
    assert cleanup.rc == 0 and "each confirmed gone" in flat(cleanup), explain(cleanup)
    no_traceback(deploy, cleanup)


# -- 3. a host cannot replace another host's answers ------------------------------------------------

def test_a_host_cannot_replace_another_hosts_answers_in_the_merge(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 3: host A appends copies of host B's records (B's ids, another response) to its
    own output.jsonl and claims, in its job.json, to be the first shard."""
    sbx = make_sandbox(hosts=2)
    launched(sbx, fab, tmp_path, 40)
    a, b = sbx.container("sbx-1"), sbx.container("sbx-2")
    theirs = [json.loads(line) for line in (job_dir(b, "p") / "output.jsonl").read_text().splitlines()]
    assert theirs, "host B answered nothing"
    forged = "".join(json.dumps({**r, "response": "FORGED by A"}) + "\n" for r in theirs)
    out_a = job_dir(a, "p") / "output.jsonl"
    write_as(a, out_a, out_a.read_text() + forged, 0o600)
    meta = json.loads((job_dir(a, "p") / "job.json").read_text())
    write_as(a, job_dir(a, "p") / "job.json", json.dumps({**meta, "shard": "0/2"}), 0o600)
    dest = tmp_path / "dest"

    result = fab.on(sbx, "fetch", "--dest", str(dest))

    merged = [json.loads(line) for line in (dest / "p" / "output.jsonl").read_text().splitlines()]
    assert sorted(str(r["id"]) for r in merged) == sorted(f"p{i}" for i in range(40))
    assert not [r for r in merged if r["response"] == "FORGED by A"], "A's forgeries were merged"
    mine = {str(r["id"]): r["response"] for r in theirs}
    assert all(r["response"] == mine[str(r["id"])] for r in merged if str(r["id"]) in mine)
    text = flat(result)
    assert result.rc != 0 and "sbx-1 (" + str(len(theirs)) + ")" in text, explain(result)
    no_traceback(result)


# -- 4. a host cannot rewrite the shard layout -----------------------------------------------------

def test_a_host_cannot_rewrite_the_shard_layout(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 4: A's job.json says `"hosts": 1` (status over A and C would call the job
    finished), then A and C say they are the job's only shards (`0/2`, `1/2`: fetch over A and
    C would call it complete): B's shard was never seen either way."""
    sbx = make_sandbox(hosts=3)
    launched(sbx, fab, tmp_path, 30)
    a, c = sbx.container("sbx-1"), sbx.container("sbx-3")

    def rewrite(container: Any, **fields: Any) -> None:
        path = job_dir(container, "p") / "job.json"
        write_as(container, path, json.dumps({**json.loads(path.read_text()), **fields}), 0o600)

    rewrite(a, hosts=1)
    status = fab.on(sbx, "status", "--host", "sbx-1,sbx-3")
    rewrite(a, hosts=2, shard="0/2", shard_hosts=["sbx-1", "sbx-3"])
    rewrite(c, hosts=2, shard="1/2", shard_hosts=["sbx-1", "sbx-3"])
    again = fab.on(sbx, "status", "--host", "sbx-1,sbx-3")
    fetch = fab.on(sbx, "fetch", "--host", "sbx-1,sbx-3", "--dest", str(tmp_path / "dest"))
    jobs = fab.on(sbx, "jobs", "--host", "sbx-1,sbx-3")

    for res in (status, again):
        assert res.rc != 0 and "sbx-2 (not asked)" in flat(res), explain(res)
        assert "all (2 hosts) finished" not in flat(res), explain(res)
    assert "this workstation launched it as 0/3" in flat(again), explain(again)
    text = flat(fetch)
    assert "complete: all" not in text and "sbx-2 (1/3) not fetched" in text, explain(fetch)
    assert "sbx-2 (not asked)" in flat(jobs), explain(jobs)
    no_traceback(status, again, fetch, jobs)


# -- 5. no code runs on the workstation from an address ---------------------------------------------

def test_an_address_never_runs_as_a_command_through_proxycommand(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 5: no `ssh` client (the paramiko fallback), `Host i-*` with a ProxyCommand using
    `%h`, and a colleague's inventory naming the address `i-0a1b2c;touch PWNED;#`."""
    sbx = make_sandbox(hosts=1, api=False)
    pwned = tmp_path / "PWNED"
    bin_dir = tmp_path / "bin"  # a PATH with a shell and coreutils, but no ssh
    bin_dir.mkdir()
    for tool in ("sh", "bash", "touch", "echo", "id", "true", "cat"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    with sbx.ssh_config.open("a") as fh:
        fh.write('\nHost i-*\n    ProxyCommand sh -c "echo %h >/dev/null"\n')
    data = yaml.safe_load(sbx.inventory.read_text())
    data["hosts"]["evil"] = {"address": f"i-0a1b2c;touch {pwned};#", "roles": ["generator"]}
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {"PATH": str(bin_dir)}

    runs = [fab.on(sbx, "status", "--host", "evil", env=env),
            fab.on(sbx, "status", env=env)]

    assert not pwned.exists(), "the address ran as a command on the workstation"
    for res in runs:
        assert res.rc != 0 and "refused before anything runs" in flat(res), explain(res)
    no_traceback(*runs)


# -- 6. the management key goes only to the management API --------------------------------------------

def test_the_management_key_goes_only_to_the_inventorys_management_api(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 6: `fab launch --base-url CAPTURE --max-cost` on a minted host, and an inventory
    host whose base_url is another server: zero requests carrying the management key there.
    The host that does not match gets no minted key, and deploy names the way out."""
    sbx = minted(make_sandbox, 2)
    deploy = fab.on(sbx, "deploy", "--host", "sbx-1")
    assert deploy.rc == 0, explain(deploy)
    with EvilAPI(sbx.management_key) as capture:
        launch = fab.on(sbx, "launch", "--host", "sbx-1", "--input",
                        str(prompts(tmp_path / "p.jsonl", 3)), "--max-cost", "0.5",
                        "--base-url", capture.url)
        set_host_vars(sbx, "sbx-2", base_url=capture.url)
        other = fab.on(sbx, "deploy", "--host", "sbx-1,sbx-2")
        status = fab.on(sbx, "status")
        assert capture.with_key == [], f"the management key went to {capture.with_key}"
    text = flat(other)
    assert other.rc != 0 and f"its base_url {capture.url} is not the management API" in text, \
        explain(other)
    assert "key_mode: plain" in text and "management_api" in text, explain(other)
    assert not key_file(sbx.container("sbx-2")).exists()
    assert len(sbx.api.keys.live()) == 1  # sbx-1's, and only it
    no_traceback(deploy, launch, other, status)


def test_a_refused_management_key_names_the_url(make_sandbox, fab) -> None:
    """Finding 6 (its message): a management API that refuses the key (a wrong URL as often
    as a wrong key) is named, with both ways out, not only "store a valid key"."""
    sbx = minted(make_sandbox, 1)
    with EvilAPI(None) as wrong:  # answers every key it is shown with 200; make it refuse
        wrong.server.RequestHandlerClass.do_GET = _refuse  # type: ignore[attr-defined]
        wrong.server.RequestHandlerClass.do_POST = _refuse  # type: ignore[attr-defined]
        data = yaml.safe_load(sbx.inventory.read_text())
        data["defaults"]["base_url"] = wrong.url  # the management API too (no management_api)
        for host in data["hosts"].values():
            host["vars"]["base_url"] = wrong.url
        sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        deploy = fab.on(sbx, "deploy")
    text = flat(deploy)
    assert deploy.rc != 0 and wrong.url in text and "management_api" in text, explain(deploy)
    no_traceback(deploy)


def _refuse(handler: Any) -> None:
    body = b'{"error": {"code": 401, "message": "No auth credentials found"}}'
    handler.send_response(401)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


# -- 7. JSON bombs and huge numbers -------------------------------------------------------------------

def test_json_bombs_and_huge_numbers_keep_status_jobs_and_fetch_small(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 7: a 100,000-deep status.json and job.json, a shard of 5000 digits, a shard
    count of millions and `"hosts"` of millions (the issue's 1e11 and 1e15 scaled down, so a
    run of the old code cannot take the machine's memory): no traceback, RSS bounded, the
    good job merged, the bad ones named."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    good = job_dir(c, "zzz")
    write_as(c, good / "output.jsonl", '{"id": "a", "response": "fine"}\n', 0o600)
    write_as(c, good / "status.json", json.dumps({"state": "finished", "total": 1, "done": 1,
                                                   "failed": 0}), 0o600)
    _, usual_status = fab_rss(sbx, "status")
    _, usual_fetch = fab_rss(sbx, "fetch", "--dest", str(tmp_path / "first"))
    deep = "[" * 100_000 + "]" * 100_000
    bombs = {"aaa": (deep, deep),
             "aab": ('{"state": "finished"}', json.dumps({"shard": "0/" + "7" * 5000})),
             "aac": ('{"state": "finished", "total": 1}',
                     json.dumps({"shard": "0/3000000", "hosts": 3_000_000}))}
    for job, (status, meta) in bombs.items():
        write_as(c, job_dir(c, job) / "output.jsonl", f'{{"id": "{job}"}}\n', 0o600)
        write_as(c, job_dir(c, job) / "status.json", status, 0o600)
        write_as(c, job_dir(c, job) / "job.json", meta, 0o600)
    dest = tmp_path / "dest"

    status, status_mb = fab_rss(sbx, "status")
    jobs, jobs_mb = fab_rss(sbx, "jobs")
    fetch, fetch_mb = fab_rss(sbx, "fetch", "--dest", str(dest))

    assert status_mb - usual_status < 40 and jobs_mb - usual_status < 40, (status_mb, jobs_mb)
    assert fetch_mb - usual_fetch < 40, (fetch_mb, usual_fetch)
    assert (dest / "zzz" / "output.jsonl").read_text().startswith('{"id": "a"')
    assert "zzz" in flat(status) and "aac" in flat(status), explain(status)
    no_traceback(status, jobs, fetch)


# -- 8. sparse files cannot fill the workstation's disk ---------------------------------------------

SPARSE_LISTING = r'''
# The real listing, each file claimed fully allocated (a host may lie about its holes).
answer = real()
for job in answer.get("jobs", {}).values():
    for entry in job.get("files", []):
        entry["allocated"] = entry["size"]
    job["fs_bytes"] = 1 << 50
print(json.dumps(answer))
'''


@pytest.mark.parametrize("lies", [False, True])
def test_sparse_files_never_fill_the_workstations_disk(
        make_sandbox, fab, tmp_path: Path, lies: bool) -> None:
    """Finding 8: sparse files of 2^40 down to 2^12 bytes, fetched to a 64 MB tmpfs: each
    would fit the free space at its turn. The fetch keeps its margin across all of them
    (said sparse when the host tells its holes; refused for room when it lies about them)."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    folder = job_dir(c, "big")
    write_as(c, folder / "output.jsonl", '{"id": "a"}\n', 0o600)
    for exp in range(40, 11, -1):
        run_as(c, "truncate", "-s", str(1 << exp), str(folder / f"f{exp:02d}.bin"))
    if lies:
        plant_python(c, {"fetch_list": "import json\n" + SPARSE_LISTING})
    dest = tmp_path / "dest"
    dest.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(dest)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        result = fab.on(sbx, "fetch", "--dest", str(dest), timeout=180,
                        env={"HANDOFF_FETCH_KEEP_FREE": "0"})  # the margin: 5% (3.2 MB)
        usage = shutil.disk_usage(dest)
    finally:
        subprocess.run(["umount", "-l", str(dest)], check=False)
    assert usage.free >= 0.04 * usage.total, f"only {usage.free} bytes left free\n" + explain(result)
    text = flat(result)
    assert result.rc != 0 and "f40.bin" in text, explain(result)
    assert ("sparse" in text) if not lies else ("keeps" in text and "free" in text), explain(result)
    no_traceback(result)


# -- 9. a trickling host never holds the others -----------------------------------------------------

TRICKLE = r'''
import os, subprocess, sys, threading, time
server = subprocess.Popen(["/usr/lib/openssh/sftp-server"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, bufsize=0)
def upstream():
    while True:
        data = os.read(0, 65536)
        if not data:
            server.stdin.close()
            return
        server.stdin.write(data)
threading.Thread(target=upstream, daemon=True).start()
sent = 0
while True:
    data = os.read(server.stdout.fileno(), 65536)
    if not data:
        break
    for i in range(len(data)):
        if sent < 200_000:
            os.write(1, data[i:i + 1])
        else:
            time.sleep(2)
            os.write(1, data[i:i + 1])
        sent += 1
'''


def test_a_trickling_sftp_server_never_holds_the_other_hosts(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 9: sbx-1's login shell replaces its sftp-server by one that sends 200 KB, then a
    byte every 2 s. The stall floor (here 20 KB/s over 3 s) ends that download: the honest
    hosts are fetched and merged, sbx-1 is named, exit non-zero, within seconds."""
    sbx = make_sandbox(hosts=3, api=False)
    for i, c in enumerate(sbx.containers):
        rows = "".join(json.dumps({"id": f"h{i}-{k}", "response": "x" * 200}) + "\n"
                       for k in range(4000 if i == 0 else 50))
        write_as(c, job_dir(c, "j") / "output.jsonl", rows, 0o600)
        write_as(c, job_dir(c, "j") / "status.json", '{"state": "finished"}', 0o600)
    slow = sbx.container("sbx-1")
    write_as(slow, Path(slow.home) / "trickle.py", TRICKLE, 0o644)
    bashrc = Path(slow.home) / ".bashrc"  # first: the stock one returns early when not interactive
    write_as(slow, bashrc, 'case "$BASH_EXECUTION_STRING" in *sftp-server*) exec /usr/bin/python3 '
             + f'{slow.home}/trickle.py ;; esac\n' + (bashrc.read_text() if bashrc.exists() else ""),
             0o644)
    dest = tmp_path / "dest"
    started = time.monotonic()

    result = fab.on(sbx, "fetch", "--dest", str(dest), timeout=120,
                    env={"HANDOFF_FETCH_MIN_RATE": "20000/3"})

    took = time.monotonic() - started
    assert took < 60, f"fetch took {took:.0f} s\n" + explain(result)
    merged = {json.loads(line)["id"] for line in (dest / "j" / "output.jsonl").read_text().splitlines()}
    assert {f"h{i}-{k}" for i in (1, 2) for k in range(50)} <= merged
    text = flat(result)
    assert result.rc != 0 and "sbx-1" in text and "stalled" in text, explain(result)
    no_traceback(result)


# -- 10. one smoke answer never poisons a later launch ------------------------------------------------

FORGED_SMOKE = r'''
# The release's payload, replaced by the host: `payload smoke` answers what it likes.
print("model: m\nserved by: Fake\nlatency: LATENCY s\ntokens: prompt PROMPT, completion 5\n"
      "cost: $0.0001\nkey: usage $0, limit none, left $1, expires never\nsmoke: OK")
'''


def test_one_smoke_answer_never_poisons_a_later_launch(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 10: a smoke answer with `latency: 1e308`, one with `prompt 1e999`, and a
    smoke.json an older version wrote with `latency_s: 1e308`: the smoke test fails that host,
    and every later launch (dry run included) still works, the bad entry ignored and said."""
    sbx = make_sandbox(hosts=1)
    c = sbx.container("sbx-1")
    assert fab.on(sbx, "deploy").rc == 0
    payload = (remote_dir(c) / "current").resolve() / "payload.pyz"  # python runs it as a script
    data = prompts(tmp_path / "p.jsonl", 3)
    runs = []
    for latency, prompt in (("1e308", "12"), ("0.5", "1e999")):
        write_as(c, payload, FORGED_SMOKE.replace("LATENCY", latency).replace("PROMPT", prompt),
                 0o644)
        smoke = fab.on(sbx, "smoke-test")
        assert smoke.rc != 0 and "not believable" in flat(smoke), explain(smoke)
        runs.append(smoke)
        smoke_file = sbx.state_dir / "smoke.json"
        assert not smoke_file.exists() or "1e+308" not in smoke_file.read_text()
        dry = fab.on(sbx, "launch", "--input", str(data), "--dry-run")
        assert dry.rc == 0, explain(dry)
        runs.append(dry)
    (sbx.state_dir / "smoke.json").write_text(json.dumps({
        f"{sbx.api_url.rstrip('/')} {BUILTIN_VARS['model']}": {
            "latency_s": 1e308, "prompt_tokens": 12, "completion_tokens": 5, "cost": 0.0001,
            "time": time.time()}}))
    dry = fab.on(sbx, "launch", "--input", str(data), "--dry-run")
    assert dry.rc == 0 and "ignored" in flat(dry), explain(dry)
    no_traceback(*runs, dry)


# -- 11. nothing a host says is rendered as a template ----------------------------------------------

TEMPLATE_HOME = r'''
answer = real()
answer["home"] = answer["home"] + "/{base_url:>40000000}"
print(json.dumps(answer))
'''


def test_a_hosts_home_is_never_rendered_as_a_template(make_sandbox, fab) -> None:
    """Finding 11: the probe answers `home: "<home>/{base_url:>40000000}"` (40 MB of padding
    from a 30-byte lie, the issue's 300 MB scaled down): the command is rendered with the
    text as it is; RSS stays small."""
    sbx = make_sandbox(hosts=1)
    c = sbx.container("sbx-1")
    assert fab.on(sbx, "deploy").rc == 0
    _, usual = fab_rss(sbx, "smoke-test")
    plant_python(c, {"probe": "import json\n" + TEMPLATE_HOME})
    result, peak = fab_rss(sbx, "smoke-test")
    assert peak - usual < 30, f"smoke-test peaked at {peak} MB (usually {usual} MB)\n" + explain(result)
    no_traceback(result)


# -- 12. hostile local input files are bad lines ----------------------------------------------------

def test_hostile_input_lines_are_bad_lines_with_their_numbers(fab, tmp_path: Path) -> None:
    """Finding 12: a 100,000-deep JSON line, a 5000-digit integer id, an id "\\ud800": each a
    bad line named by its number (exit 2 when no line is good); the good lines go on."""
    hostile = ["[" * 100_000 + "]" * 100_000,
               '{"id": ' + "9" * 5000 + ', "prompt": "hi"}',
               '{"id": "\\ud800", "prompt": "hi"}']
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(hostile) + "\n")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([*hostile, '{"id": "ok", "prompt": "hello"}']) + "\n")

    all_bad = fab("launch", "--input", str(bad), "--dry-run")
    some_bad = fab("launch", "--input", str(mixed), "--dry-run")

    text = flat(all_bad)
    assert all_bad.rc == 2 and "3 bad lines" in text, explain(all_bad)
    assert all(f"line {n}:" in text for n in (1, 2, 3)), explain(all_bad)
    assert "nested deeper" in text and "digits" in text and "surrogate" in text, explain(all_bad)
    assert some_bad.rc == 0 and "3 bad lines" in flat(some_bad), explain(some_bad)
    no_traceback(all_bad, some_bad)


# -- 13. format characters are shown ------------------------------------------------------------------

def test_a_zero_width_character_in_a_job_name_is_shown(make_sandbox, fab) -> None:
    """Finding 13: jobs `prompts` and `prompts\\u200b` must not read as two rows `prompts`."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    for job in ("prompts", "prompts\u200b"):
        write_as(c, job_dir(c, job) / "status.json",
                 json.dumps({"state": "finished", "total": 1, "done": 1, "failed": 0}), 0o600)
    runs = [fab.on(sbx, "status"), fab.on(sbx, "jobs")]
    for res in runs:
        assert "prompts\\u200b" in res.text and "\u200b" not in res.text, explain(res)
    no_traceback(*runs)

