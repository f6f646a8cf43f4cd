"""`backend: vllm` through `.venv/bin/fab` against a real sshd container on loopback (CPU).

The container's `python` var is a vLLM venv's interpreter (HANDOFF_VLLM_PYTHON: it must
live where the sandbox's throwaway users can run it, so not under /root; `bash scripts/vllm-venv` as root
builds it at /var/cache/handoff-vllm-0.32.0 on the system python; point HANDOFF_VLLM_PYTHON at its bin/python). The host says
`gpus: 0` (a CPU host: no nvidia-smi, no CUDA asked) and `tp: 1`.

One pass over the control plane, as an operator would run it:
push-script, launch (the engine starts), status (running), stop (SIGTERM reaches the
payload and the engine: no engine process stays), verify (every check green: the vllm
module and its version range, the disk preflight run by the payload itself), launch
again (it resumes), status --wait (finished), fetch (every id once, features of the
right shapes), and nothing of the engine left on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import explain, remote_dir, wait_until
from tests.vllm_support import HIDDEN, build_chat_model, chat_records, marked_engine_processes

pytestmark = pytest.mark.timeout(1500)
RECORDS = chat_records(24, seed=5)
LAYERS = [2, 3, 6]


def _sandbox_runnable(py: Path) -> str | None:
    """Why the sandbox users cannot run `py`, or None: every folder above it must be
    searchable by others (a venv under /root is not), its interpreter executable."""
    real = Path(os.path.realpath(py))
    for p in [real, *real.parents]:
        try:
            mode = p.stat().st_mode
        except OSError as exc:
            return f"{p}: {exc}"
        if not mode & stat.S_IXOTH:
            return f"{p} is not searchable/executable by other users (mode {stat.filemode(mode)})"
    return None


@pytest.fixture(scope="module")
def sandbox_vllm_python() -> Path:
    if os.environ.get("HANDOFF_NO_VLLM"):
        pytest.skip("HANDOFF_NO_VLLM is set: the tests against a real vLLM engine are off")
    raw = os.environ.get("HANDOFF_VLLM_PYTHON")
    if not raw:
        pytest.skip("HANDOFF_VLLM_PYTHON is unset: this test needs a vLLM venv the sandbox "
                    "users can run (HANDOFF_VLLM_VENV=/var/cache/handoff-vllm-0.32.0 "
                    "PYTHON=/usr/bin/python3 bash scripts/vllm-venv, then point "
                    "HANDOFF_VLLM_PYTHON at its bin/python)")
    py = Path(raw)
    why = _sandbox_runnable(py)
    if why:
        pytest.skip(f"HANDOFF_VLLM_PYTHON={py} cannot run as a sandbox user: {why}; build "
                    "the venv outside /root (HANDOFF_VLLM_VENV=/var/cache/handoff-vllm-0.32.0 "
                    "PYTHON=/usr/bin/python3 bash scripts/vllm-venv)")
    return py


def _chown(path: Path, user: str) -> None:
    subprocess.run(["chown", "-R", f"{user}:", str(path)], check=True, timeout=60)


def _status(fab, sbx, env) -> dict:
    r = fab.on(sbx, "status", "--json", env=env)
    lines = [line for line in r.out.splitlines() if line.startswith("{")]
    assert lines, explain(r)
    return json.loads(lines[-1])


def test_vllm_backend_end_to_end_verify_launch_status_stop_resume_fetch(
        sandbox_vllm_python, make_sandbox, fab, tmp_path, tmp_path_factory) -> None:
    sbx = make_sandbox(hosts=1, api=False, defaults={"start_watch_s": 1.0})
    c = sbx.containers[0]
    model = Path(c.home) / "models" / "tiny-llama"
    shutil.copytree(build_chat_model(tmp_path_factory.mktemp("vllm-role-model")), model)
    _chown(Path(c.home) / "models", c.user)

    data = sbx.inventory_data()
    host = data["hosts"][c.name]
    host["roles"] = ["extractor"]
    host["vars"].update({"python": str(sandbox_vllm_python), "backend": "vllm", "gpus": 0,
                         "ranks": 1, "tp": 1, "model_dir": str(model), "dtype": "float32",
                         "layers": ",".join(map(str, LAYERS)), "max_length": 600,
                         "batch_tokens": 512, "input": "~/.handoff/data/gen.jsonl"})
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {"HANDOFF_INVENTORY": str(inv)}
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))

    r = fab.on(sbx, "push-script", "--host", c.name, env=env)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "launch", "--host", c.name, "--input", str(gen), env=env, timeout=300)
    assert r.rc == 0, explain(r)
    jd = remote_dir(c) / "jobs" / "extractor"
    from payload.extract.backends.reaper import owner_of

    owner = owner_of(jd / "features", "shard0-of-1.rank0-of-1")  # this job's engine only

    def engine() -> list[int]:
        return marked_engine_processes(owner)

    pid = int((jd / "pid").read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0].decode() == str(sandbox_vllm_python), argv  # the role's `python` var
    for flag, value in ((b"--backend", b"vllm"), (b"--tensor-parallel-size", b"1"),
                        (b"--nproc-per-node", b"1")):
        assert argv[argv.index(flag) + 1] == value, argv
    assert _status(fab, sbx, env)["state"] == "running"

    # stop while the engine starts (its processes are up, marked by the backend): the
    # payload stops at once (exit 3) rather than after the start, and nothing stays
    assert wait_until(lambda: bool(engine()), 300, 0.2), _log_tail(jd)
    r = fab.on(sbx, "stop", "--host", c.name, "--timeout", "150", env=env, timeout=300)
    assert r.rc == 0, explain(r)
    rec = _status(fab, sbx, env)
    assert rec["state"] == "stopped" and rec["alive"] is False, f"{rec}{_log_tail(jd)}"
    assert wait_until(lambda: not engine(), 30, 0.5), \
        f"engine processes outlived the stop: {engine()}"

    # the input is on the host now: verify runs every check, the payload's preflight too
    r = fab.on(sbx, "verify", "--host", c.name, env=env, timeout=600)
    assert r.rc == 0, explain(r)
    for row in ("module vllm", "vllm version", "disk for the features"):
        line = next((x for x in r.out.splitlines() if row in x), "")
        assert line and "missing" not in line and "skipped" not in line, (row, explain(r))
    assert "0.32" in r.out and "nvidia-smi" not in r.out, explain(r)

    # launch again: it resumes and finishes
    r = fab.on(sbx, "launch", "--host", c.name, "--input", str(gen), env=env, timeout=300)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--host", c.name, "--wait", "--interval", "2", env=env,
               timeout=900)
    assert r.rc == 0 and "finished" in r.out, explain(r) + _log_tail(jd)
    assert wait_until(lambda: not engine(), 30, 0.5), \
        f"engine processes outlived the run: {engine()}"

    dest = tmp_path / "fetched"
    r = fab.on(sbx, "fetch", "--host", c.name, "--dest", str(dest), env=env, timeout=300)
    assert r.rc == 0, explain(r)
    out = dest / c.name / "extractor" / "features"
    from tests.payload.extract.helpers import read_features

    feats = read_features(out, "native")
    assert set(feats) == {str(rec["id"]) for rec in RECORDS}
    lines = (out / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == len(RECORDS)  # every id once, over the stop and the resume
    for key, f in feats.items():
        t = f["input_ids"].shape[0]
        assert f["aux"].shape == (t, len(LAYERS) * HIDDEN), key
        assert f["final"].shape == (t, HIDDEN) and bool(f["loss_mask"].any()), key
        assert f["aux"].isfinite().all() and f["final"].isfinite().all(), key
    from tests.payload.extract.helpers import stats

    s = stats(out)  # the finished (resumed) run's: every sample, on the vLLM engine
    assert s["state"] == "finished" and s["written"] == len(RECORDS), s
    assert s["device"] == "vllm 0.32.0 (cpu, tensor parallel 1)", s
    assert not (jd / "features" / ".engine").exists()  # the engine's files went as read
    assert not [p for p in (jd / "features").rglob("*") if ".tmp" in p.name]


def _log_tail(jd: Path) -> str:
    log = jd / "log"
    return "\n--- job log ---\n" + (log.read_text(errors="replace")[-4000:] if log.exists() else "")
