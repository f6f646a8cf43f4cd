"""Pure pieces of the job tasks: state derivation, smoke output parsing, ETA, fetch policy."""

from __future__ import annotations

from handoff import jobs


def test_job_state() -> None:
    assert jobs.job_state({"alive": True, "status": {"state": "running"}}) == "running"
    assert jobs.job_state({"alive": True, "status": None}) == "running"
    assert jobs.job_state({"alive": True, "status": {"state": "stopped"}}) == "stopping"
    assert jobs.job_state({"alive": True, "status": {"state": "finished"}}) == "running"  # exiting
    assert jobs.job_state({"alive": False, "pid": 5, "status": {"state": "running"}}) == "dead"
    assert jobs.job_state({"alive": False, "pid": 5, "status": {"state": "finished"}}) == "finished"
    assert jobs.job_state({"alive": False, "pid": 5, "status": {"state": "stopped"}}) == "stopped"
    assert jobs.job_state({"alive": False, "pid": 5, "status": None}) == "dead"
    assert jobs.job_state({"alive": False, "pid": None, "status": None}) == "none"
    assert {"running", "finished"} <= jobs.OK_STATES and "stopped" not in jobs.OK_STATES


def test_parse_smoke_and_credit() -> None:
    text = (
        "model:     moonshotai/kimi-k2.5\n"
        "served by: DeepInfra (moonshotai/kimi-k2.5)\n"
        "latency:   0.42 s\n"
        "tokens:    prompt 9, completion 32\n"
        "cost:      $0.000100\n"
        "answer:    'ready'\n"
        "key:       usage $0.000300, limit $10.000000, left $9.999700\n"
        "smoke: OK\n"
    )
    f = jobs.parse_smoke(text)
    assert f["served by"].startswith("DeepInfra") and f["latency"] == "0.42 s" and f["smoke"] == "OK"
    assert jobs._credit(f["key"]) == "$9.999700 left (used $0.000300)"
    assert jobs._credit("usage unknown (GET /key answered 404)") == "usage unknown (GET /key answered 404)"


def test_eta() -> None:
    assert jobs._eta({"total": 100, "done": 40, "failed": 10, "rate_rps": 5}) == "10s"
    assert jobs._eta({"total": 100000, "done": 0, "failed": 0, "rate_rps": 10}) == "2.8h"
    assert jobs._eta({"total": None, "rate_rps": 5}) == "-"


def test_fetch_resumes_only_append_only_files() -> None:
    assert jobs._append_only("output.jsonl") and jobs._append_only("output.errors.jsonl")
    assert jobs._append_only("log") and jobs._append_only("features/manifest.jsonl")
    assert not jobs._append_only("status.json") and not jobs._append_only("features/x.safetensors")


def test_launch_command_is_detached_without_pty_or_stdin() -> None:
    cmd = jobs.launch_command(None, "python3 payload.pyz generate", "/h/jobs/g", {"job": "g"})  # type: ignore[arg-type]
    assert "setsid nohup python3 payload.pyz generate >>log 2>&1 </dev/null &" in cmd
    assert "echo $pid > pid" in cmd


def test_sh_path_keeps_home_expandable_and_quotes_the_rest() -> None:
    import subprocess

    from handoff.remote import sh_path

    assert sh_path("~") == '"$HOME"'
    assert sh_path("~/a b/c") == "\"$HOME\"/'a b/c'"
    assert sh_path("/x;rm -rf /") == "'/x;rm -rf /'"
    out = subprocess.run(["sh", "-c", f"echo {sh_path('~/a b')}"], capture_output=True, text=True,
                         env={"HOME": "/h"}).stdout
    assert out == "/h/a b\n"
