"""`generate`'s input survey, bad lines and a full disk (docs/records.md, "Input"; issue 9).

Real subprocess runs against the fake OpenRouter; the full-disk test mounts a 4 MB tmpfs
(we run as root in CI; it is skipped, saying why, where mounting is refused).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from payload.records import errors_path, parse_shard
from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    gen_args,
    payload_cmd,
    payload_env,
    read_jsonl,
    run_payload,
    status_of,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_non_utf8_line_is_a_bad_line_not_a_mangled_prompt(fake_factory, key_file, tmp_path):
    """Issue 9 case 3: a line with the byte 0xe9 was sent as U+FFFD and paid for."""
    fake = fake_factory(record_bodies=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 5)
    with inp.open("ab") as fh:
        fh.write(b'{"id": "latin1", "prompt": "caf\xe9 au lait"}\n')
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    assert "line 6: bad record skipped: not valid UTF-8 (byte 0xe9" in proc.stderr
    assert_exactly_once(ids, out)
    assert fake.stats.requests == 5
    assert all("\ufffd" not in json.dumps(b, ensure_ascii=False) for b in fake.stats.bodies)
    st = status_of(out)
    assert st["bad_lines"] == 1
    assert st["bad_line_samples"] == [
        {"line": 6, "reason": "not valid UTF-8 (byte 0xe9 at byte 32 of the line)"}]


def test_plain_prompt_records_are_one_user_message(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n"
                           for i in range(20)), encoding="utf-8")
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    done, _ = assert_exactly_once([f"p{i}" for i in range(20)], out)
    assert {json.dumps(r["messages"]) for r in done} == {
        json.dumps([{"role": "user", "content": f"question {i}"}]) for i in range(20)}


def test_an_input_with_no_valid_record_fails_before_sending(fake_factory, key_file, tmp_path):
    """Issue 9 case 2: 100 lines of a shape nobody accepts "finished 0/0/0" with exit 0."""
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": f"q {i}"}) + "\n" for i in range(100)),
                   encoding="utf-8")
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 2, proc.stderr
    assert f"no valid record in {inp}" in proc.stderr
    assert "no 'messages', 'conversations' or 'prompt' field (keys: 'id', 'text')" in proc.stderr
    assert "Accepted shapes" in proc.stderr
    assert fake.stats.requests == 0
    st = status_of(out)
    assert (st["state"], st["exit_code"], st["bad_lines"]) == ("aborted", 2, 100)
    assert st["state"] != "finished" and "no valid record" in st["last_error"]


def test_bad_lines_do_not_flood_the_log(fake_factory, key_file, tmp_path):
    """Issue 9 case 2: one log line per bad record (40k lines for a 40k run). Now: the first
    ten, one summary, and the count and a sample in the status file."""
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10)
    with inp.open("a", encoding="utf-8") as fh:
        fh.writelines("{broken\n" for _ in range(5000))
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("bad record skipped") == 10
    assert "5000 bad lines in all (the first 10 shown" in proc.stderr
    assert len(proc.stderr) < 8000
    assert_exactly_once(ids, out)
    st = status_of(out)
    assert st["bad_lines"] == 5000 and len(st["bad_line_samples"]) == 20
    assert st["bad_line_samples"][0] == {"line": 11, "reason": "not JSON (Expecting property "
                                         "name enclosed in double quotes at column 2)"}


def test_sharded_totals_and_eta_from_the_start(fake_factory, key_file, tmp_path):
    """Issue 9 case 7: a shard knew its total only once it had read its input to the end."""
    fake = fake_factory(latency_s=0.2)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3000)
    args = gen_args(fake, key_file, inp, out, "--shard", "1/2", "--concurrency", "50")
    proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    status = out.with_name("out.status.json")
    first = None
    deadline = time.monotonic() + 30
    while first is None and time.monotonic() < deadline:
        time.sleep(0.05)
        if status.exists():
            with open(status, encoding="utf-8") as fh:
                text = fh.read()
            if text:
                first = json.loads(text)
    proc.terminate()
    proc.communicate(timeout=30)
    assert first is not None and first["state"] == "running"
    assert first["done"] < 100
    owned = sum(1 for i in range(3000) if parse_shard("1/2").owns(str(i)))
    assert first["total"] == owned


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}): "
                    "the full-disk test needs root and mount rights")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "4m")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_stops_within_30s_exit_3_and_says_why(fake_factory, key_file, tmp_path,
                                                        small_disk):
    """Issue 9 case 4: a 4 MB tmpfs as the job folder used to hang the job forever as
    "running". Now: exit 3 within 30 s, the final status written (from the reserve) with
    the reason, the log not looping; after freeing space the rerun resumes exactly once."""
    fake = fake_factory(latency_s=0.01)
    inp = tmp_path / "in.jsonl"
    ids = [str(i) for i in range(6000)]
    with inp.open("w", encoding="utf-8") as fh:  # ~2 KB records: 4 MB holds about 2000
        for i in ids:
            fh.write(json.dumps({"id": int(i), "messages": [
                {"role": "user", "content": f"question {i} " + "x" * 2000}]}) + "\n")
    out = small_disk / "job" / "output.jsonl"
    log = small_disk / "job" / "log"
    out.parent.mkdir()
    args = gen_args(fake, key_file, inp, out, "--concurrency", "200")
    t0 = time.monotonic()
    with log.open("w") as log_fh:  # the job's log on the same full disk, as fab launch does
        proc = subprocess.run(payload_cmd(*args), cwd=REPO, env=payload_env(), stdout=log_fh,
                              stderr=log_fh, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 3
    assert took < 30
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["exit_code"]) == ("stopped", "disk_full", 3)
    assert "no space left on device" in st["last_error"]
    assert 0 < st["done"] < 6000
    assert log.stat().st_size < 64 * 1024  # it said so, once; no loop
    assert not list(out.parent.glob(".*reserve"))  # the reserve was given back
    # Free space (a bigger disk) and rerun: it resumes where it stopped.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = run_payload(*args, timeout=90)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_exactly_once(ids, out)
    assert not read_jsonl(errors_path(out))


def test_a_shard_taken_over_asks_only_what_is_not_answered_elsewhere(fake_factory, key_file, tmp_path):
    """Issue 32 #4: `--shard 0,2/3` owns two shards; `--exclude-ids` leaves out the ids a
    dead host already answered: each is asked never, the rest exactly once, and the total
    counts only what is to be asked here."""
    from payload.records import shard_of

    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 60)
    mine = [i for i in ids if shard_of(i, 3) in (0, 2)]
    answered = [i for i in mine if shard_of(i, 3) == 2][::2]  # half of shard 2, done elsewhere
    exclude = tmp_path / "exclude.jsonl"
    exclude.write_text("".join(json.dumps(i) + "\n" for i in answered))
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--shard", "0,2/3",
                                 "--exclude-ids", str(exclude)))
    assert proc.returncode == 0, proc.stderr
    todo = [i for i in mine if i not in answered]
    assert_exactly_once(todo, out)
    assert sorted(str(r["id"]) for r in read_jsonl(out)) == sorted(todo)
    assert fake.stats.requests == len(todo) and status_of(out)["total"] == len(todo)
    assert str(parse_shard("0,2/3")) == "0,2/3" and parse_shard("0,2/3").owns(mine[0])
    with pytest.raises(ValueError, match=r"each I must be in 0\.\.N-1, once"):
        parse_shard("1,1/3")
    exclude.write_text('{"id": 1}\n')
    bad = run_payload(*gen_args(fake, key_file, inp, tmp_path / "o2.jsonl", "--shard", "0/3",
                                "--exclude-ids", str(exclude)))
    assert bad.returncode == 2 and "--exclude-ids" in bad.stderr and "line 1: not an id" in bad.stderr
