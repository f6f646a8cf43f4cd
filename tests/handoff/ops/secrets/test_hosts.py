"""The key on fake hosts (handoff.testing.local): placed 0600 from its creation in a 0700
folder, idempotent, in the ledger; removed by cleanup-secrets with its temp leftovers and
proven gone, also for a host named with --host that the ledger forgot; the cleanup plan
as data (`--dry-run`, no host contacted)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from handoff.cli import commands
from handoff.config import os_keyring, state
from handoff.ops import deploy
from handoff.ops.secrets import cleanup
from handoff.ops.secrets import place as placing
from handoff.run import plan
from tests.support.workstation import Workstation

KEY = "sk-or-v1-" + "cd" * 32


def place(ws: Workstation, spec: str, key: str = KEY) -> None:
    reports = plan.execute(deploy.build(ws.targets(spec), verify=False, script=False, key=key),
                           connect=ws.connect)
    assert all(r.ok for r in reports), [r.error for r in reports]


def keyfile(ws: Workstation, label: str) -> Path:
    return ws.remote_dir(label) / "secrets" / "openrouter.key"


def test_place_creates_the_file_0600_exclusively_and_is_idempotent(ws: Workstation) -> None:
    [target] = ws.targets("a")
    place(ws, "a")
    path = keyfile(ws, "a")
    assert path.read_text() == KEY and stat.S_IMODE(path.stat().st_mode) == 0o600
    with ws.connect(target) as session:  # what the placement asked of the file system
        from handoff.host.facts import KEY_FILE, gather

        facts = gather(session, None, files={KEY_FILE: str(target.vars["key_path"])})
        assert placing.place(session, facts, KEY).startswith(f"key {os_keyring.fingerprint(KEY)} already at")
        assert session.files.calls == []  # type: ignore[attr-defined]  # compared on the host: no write
        new = "sk-or-v1-" + "ef" * 32
        assert placing.place(session, facts, new).startswith("placed key")
        ops = [op for op, _ in session.files.calls]  # type: ignore[attr-defined]
    assert ops.index("create") < ops.index("rename")  # temp name, then rename over
    assert path.read_text() == new
    placed = [e for e in state.ledger_events() if e.event == "placed"]
    assert [e.fingerprint for e in placed] == [os_keyring.fingerprint(KEY), os_keyring.fingerprint(new)]
    assert all(KEY not in line and new not in line
               for line in state.ledger_path().read_text().splitlines())


def test_cleanup_removes_every_placed_key_and_its_leftovers(ws: Workstation,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    place(ws, "a,b")
    leftover = keyfile(ws, "a").with_name(".openrouter.key.tmp-abc123")
    leftover.write_text(KEY)  # a push cut off between create and rename
    assert commands.cleanup_secrets() == 0
    assert not keyfile(ws, "a").exists() and not keyfile(ws, "b").exists() and not leftover.exists()
    assert state.placed() == []
    out = capfd.readouterr().out
    # a, b from the ledger; s, t are inventory hosts checked too (nothing there).
    assert out.count("verified gone") == 2 and "removed 2 key file(s), 2 already absent" in out
    assert commands.cleanup_secrets() == 0
    assert "removed 0 key file(s), 4 already absent" in capfd.readouterr().out


def test_cleanup_of_a_named_host_the_ledger_forgot(ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    place(ws, "a")
    state.ledger_path().unlink()  # a wiped state dir
    assert commands.cleanup_secrets("a") == 0
    assert not keyfile(ws, "a").exists() and "verified gone" in capfd.readouterr().out
    assert commands.cleanup_secrets("b") == 0  # never placed there: reported, not an error
    assert "already absent" in capfd.readouterr().out


def test_cleanup_dry_run_lists_the_files_and_contacts_no_host(ws: Workstation,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    place(ws, "a,b")
    touched: list[str] = []
    commands.common.CONNECT = lambda target: touched.append(target.label)  # type: ignore[assignment,return-value]
    assert commands.cleanup_secrets(dry_run=True) == 0
    out = capfd.readouterr().out
    # a and b from the ledger (with their fingerprints), s and t: inventory hosts to check.
    assert touched == [] and "dry run" in out and out.count("remove the key file") == 4
    assert str(keyfile(ws, "a")) in out and os_keyring.fingerprint(KEY) in out and KEY not in out
    assert out.count("remove the key file .handoff/secrets/openrouter.key") == 2
    assert keyfile(ws, "a").exists() and len(state.placed()) == 2


def test_cleanup_plan_groups_keys_by_host() -> None:
    def entry(user: str, path: str) -> state.LedgerEntry:
        return state.LedgerEntry(host=user, hostname="127.0.0.2", port=22, user=user, identity=[],
                                 path=path, fingerprint="abcd1234", time=1.0)

    p = cleanup.cleanup_plan([entry("u1", "/h/k1"), entry("u2", "/h/k"), entry("u1", "/h/k2")])
    assert [(hp.target.label, [s.params.path for s in hp.steps[:-1]]) for hp in p.hosts] == \
        [("u1", ["/h/k1", "/h/k2"]), ("u2", ["/h/k"])]
    assert all(s.action == "remove-key" and s.changes for hp in p.hosts for s in hp.steps[:-1])
    # ... and, last, every job's own key beside them (a job with a budget has one)
    assert [hp.steps[-1].params.folders for hp in p.hosts] == [("/h/jobs",), ("/h/jobs",)]
    assert all(hp.steps[-1].action == "remove-job-keys" for hp in p.hosts)


def test_cleanup_takes_role_and_says_which_hosts(ws: Workstation,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """cleanup-secrets had no --role though every task takes it, and no `hosts:` line
    (issue 22 #16)."""
    place(ws, "a,s")
    assert commands.cleanup_secrets(role="sleeper") == 0
    out = capfd.readouterr()
    assert "hosts: s, t (named with --host/--role)" in out.err
    assert keyfile(ws, "a").exists() and not keyfile(ws, "s").exists()
    assert commands.cleanup_secrets() == 0
    assert "hosts: " in capfd.readouterr().err and not keyfile(ws, "a").exists()
    assert commands.cleanup_secrets(role="nosuch") == 2
    assert "unknown role 'nosuch'" in capfd.readouterr().err
