"""The remote layout, named once: every folder under remote_dir, `~` resolved in one place."""

from __future__ import annotations

from handoff.config.layout import RemoteLayout, expand_home, parents


def test_layout_names_every_folder() -> None:
    lay = RemoteLayout.of({"remote_dir": "~/.handoff/"})
    assert lay.root == "~/.handoff"
    assert lay.release("abc") == "~/.handoff/releases/abc" and lay.current == "~/.handoff/current"
    assert lay.payload == "~/.handoff/current/payload.pyz"
    assert lay.key_path == "~/.handoff/secrets/openrouter.key"
    assert lay.data_file("in.jsonl") == "~/.handoff/data/in.jsonl"
    assert lay.job("b3") == "~/.handoff/jobs/b3"
    assert lay.venv_python == "~/.handoff/venv/bin/python"
    assert RemoteLayout.of({}).root == "~/.handoff"  # the default remote_dir
    assert lay.under("/home/u").job("g") == "/home/u/.handoff/jobs/g"
    assert RemoteLayout.of({"remote_dir": "/srv/h"}).under("/home/u").root == "/srv/h"


def test_expand_home_and_parents() -> None:
    assert expand_home("~", "/h") == "/h" and expand_home("~/a", "/h/") == "/h/a"
    assert expand_home("/abs", "/h") == "/abs" and expand_home("~user/x", "/h") == "~user/x"
    assert parents("~/.handoff/releases/abc") == [
        "~/.handoff/releases/abc", "~/.handoff/releases", "~/.handoff", "~"]
    assert parents("/srv/h") == ["/srv/h", "/srv"]
