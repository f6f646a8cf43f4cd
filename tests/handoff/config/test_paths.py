"""Paths come from the project directory, not from the package's location: inventory, roles
(a local roles/ overrides the shipped ones), state dir; the release builds from the
installed payload package."""

from __future__ import annotations

from pathlib import Path

import pytest

from handoff.config import paths, roles
from handoff.ops import releases


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HANDOFF_INVENTORY", raising=False)
    monkeypatch.delenv("HANDOFF_STATE_DIR", raising=False)
    monkeypatch.setattr(paths, "_project", None)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults_resolve_from_the_current_directory(project: Path) -> None:
    assert paths.project_dir() == project
    assert paths.inventory_path() == project / "inventory" / "hosts.yml"
    assert paths.state_dir() == project / ".handoff"
    assert paths.roles_dirs() == [paths.PACKAGE_DATA / "roles"]  # no local roles/: the shipped ones


def test_the_fabfile_folder_wins_over_the_cwd(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("proj")
    paths.use_project(other)
    assert paths.inventory_path() == other / "inventory" / "hosts.yml"
    assert paths.state_dir() == other / ".handoff"


def test_env_overrides(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDOFF_INVENTORY", "~/inv.yml")
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(project / "st"))
    monkeypatch.setenv("HOME", str(project / "home"))
    assert paths.inventory_path() == project / "home" / "inv.yml"
    assert paths.state_dir() == project / "st"


def test_local_roles_override_the_shipped_ones_and_add_new(project: Path) -> None:
    assert {"generator", "extractor"} <= set(roles.known_roles())
    (project / "roles").mkdir()
    (project / "roles" / "generator.yml").write_text("description: my own generator\n")
    (project / "roles" / "scorer.yml").write_text("description: a new kind of container\n")
    assert roles.get_role("generator").description == "my own generator"
    assert roles.get_role("extractor").path == paths.PACKAGE_DATA / "roles" / "extractor.yml"
    assert {"generator", "extractor", "scorer"} <= set(roles.known_roles())


def test_shipped_data_is_in_the_package() -> None:
    assert (paths.PACKAGE_DATA / "roles" / "generator.yml").is_file()
    assert paths.demo_prompts().is_file() and paths.demo_prompts().parent == paths.PACKAGE_DATA
    import payload

    assert Path(payload.__file__).resolve().parent == releases.PAYLOAD_DIR


def test_the_checkout_s_roles_and_examples_are_the_package_data() -> None:
    """In a checkout, `roles/` and `examples/prompts.jsonl` are links to the package data:
    one copy of each file."""
    repo = Path(__file__).resolve().parents[3]
    assert (repo / "roles").resolve() == paths.PACKAGE_DATA / "roles"
    assert (repo / "examples" / "prompts.jsonl").resolve() == paths.demo_prompts()
