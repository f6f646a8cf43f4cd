"""Roles: the shipped files load, validation names file:line, commands render quoted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from handoff.errors import RoleError
from handoff.roles import get_role, known_roles, load_role, render_command


def test_shipped_roles() -> None:
    assert {"generator", "extractor"} <= set(known_roles())
    gen = get_role("generator")
    assert gen.requires.python >= (3, 10) and "aiohttp" in gen.requires.modules and gen.secret
    ext = get_role("extractor")
    assert {"torch", "transformers", "safetensors"} <= set(ext.requires.modules)
    assert "nvidia-smi" in ext.requires.commands and ext.requires.disk_gb > 0 and not ext.secret
    assert ext.requires.gpus_needed({"gpus": 8}) == 8
    assert ext.requires.gpus_needed({"gpus": None}) == 1


def test_unknown_role_lists_known() -> None:
    with pytest.raises(RoleError, match=r"unknown role 'nope'; known roles: .*generator"):
        get_role("nope")


def test_bad_role_file_names_line(tmp_path: Path) -> None:
    path = tmp_path / "x.yml"
    path.write_text("requires:\n  python: '>=3.10'\n  modulez: [a]\n")
    with pytest.raises(RoleError, match=rf"{path}:3: unknown requirement 'modulez'"):
        load_role(path)


def generator_vars(**extra: object) -> dict[str, object]:
    v: dict[str, object] = {
        "python": "/opt/py/bin/python3", "remote_dir": "/home/u/.handoff", "input": "/d/in put.jsonl",
        "job_dir": "/home/u/.handoff/jobs/generator", "key_path": "/home/u/.handoff/secrets/k.key",
        "model": "moonshotai/kimi-k2.5", "base_url": "http://127.0.0.1:1/api/v1",
        "provider": {"quantizations": ["int4"], "ignore": ["fireworks", "baseten"]},
        "concurrency": 2000, "max_cost": None, "shard": None,
    }
    v.update(extra)
    return v


def test_generator_launch_renders_and_drops_unset_groups() -> None:
    cmd = render_command(get_role("generator").launch, generator_vars(), "launch")
    argv = shlex.split(cmd)
    assert argv[:3] == ["/opt/py/bin/python3", "/home/u/.handoff/current/payload.pyz", "generate"]
    assert argv[argv.index("--input") + 1] == "/d/in put.jsonl"  # quoted, one argv item
    assert argv[argv.index("--api-key-file") + 1] == "/home/u/.handoff/secrets/k.key"
    assert argv[argv.index("--provider") + 1] == '{"ignore":["fireworks","baseten"],"quantizations":["int4"]}'
    assert "--max-cost" not in argv and "--shard" not in argv


def test_generator_launch_with_shard_and_budget() -> None:
    argv = shlex.split(render_command(get_role("generator").launch,
                                      generator_vars(shard="1/3", max_cost=2.5), "launch"))
    assert argv[argv.index("--shard") + 1] == "1/3"
    assert argv[argv.index("--max-cost") + 1] == "2.5"


def test_missing_required_var_names_it() -> None:
    with pytest.raises(RoleError, match="needs var input"):
        render_command(get_role("generator").launch, generator_vars(input=None), "launch")


def test_extractor_launch_uses_torchrun() -> None:
    v = generator_vars(gpus=8, model_dir="/models/k", layers="2,16,29")
    argv = shlex.split(render_command(get_role("extractor").launch, v, "launch"))
    assert argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[argv.index("--output-dir") + 1] == "/home/u/.handoff/jobs/generator/features"
    assert argv[argv.index("--layers") + 1] == "2,16,29"
