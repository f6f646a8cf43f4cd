"""YAML loading keeps file:line in its errors with whichever parser PyYAML offers (libyaml's
C parser when built with it, the pure-Python one otherwise), and role files parse once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from handoff.config import roles, yamlfile


@pytest.fixture(params=["libyaml", "pure"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "libyaml" and not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML built without libyaml")
    base = yaml.SafeLoader if request.param == "pure" else yaml.CSafeLoader
    monkeypatch.setattr(yamlfile, "_Loader", yamlfile.loader_class(base))
    return str(request.param)


def test_errors_name_file_and_line_with_either_parser(loader: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(yamlfile.YamlError, match=rf"^{bad}:3: invalid YAML"):
        yamlfile.load(bad)
    dup = tmp_path / "dup.yml"
    dup.write_text("a: 1\nb:\n  x: 1\n  x: 2\n")
    with pytest.raises(yamlfile.YamlError, match=rf"^{dup}:4: duplicate key 'x'"):
        yamlfile.load(dup)
    good = tmp_path / "good.yml"
    good.write_text("a: 1\nb:\n  x: [1, 2]\n")
    data = yamlfile.load(good)
    assert data == {"a": 1, "b": {"x": [1, 2]}}
    assert yamlfile.line_of(data, "b") == 2 and yamlfile.line_of(data["b"], "x") == 3


def test_a_role_parses_once_per_version_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "r.yml"
    path.write_text("description: one\n")
    first = roles.get_role("r", tmp_path)
    assert roles.get_role("r", tmp_path) is first  # 8 hosts of one role: one parse
    path.write_text("description: two, longer\n")  # a different size: re-read even within the mtime tick
    assert roles.get_role("r", tmp_path).description == "two, longer"
