"""Roles: the shipped files load, validation names file:line, commands render quoted."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from handoff.config.roles import get_role, known_roles, load_role
from handoff.config.templates import render_command
from handoff.errors import RoleError


def test_shipped_roles() -> None:
    assert {"generator", "extractor"} <= set(known_roles())
    gen = get_role("generator")
    assert gen.requires.python >= (3, 10) and "aiohttp" in gen.requires.modules and gen.secret
    ext = get_role("extractor")
    assert {"torch", "transformers", "safetensors", "tokenizers"} <= set(ext.requires.modules)
    assert "nvidia-smi" in ext.requires.commands and ext.requires.cuda_torch and not ext.secret
    assert ext.preflight is not None and "{model_dir}/config.json" in ext.requires.files
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


def test_generator_batch_mode_and_cancel_parse_as_the_payload_reads_them() -> None:
    """`mode` and the batch vars reach `payload generate`; the job's ledger is always named
    (a relaunch re-attaches to it); the role's `cancel` command (what `fab stop` runs for a
    job whose process is gone) is a `payload batches --cancel` on that same ledger."""
    from payload.cli import build_parser

    role = get_role("generator")
    v = generator_vars(mode="batch", batch_requests=100, batch_poll=0.5)
    argv = shlex.split(render_command(role.launch, v, "launch"))
    args = build_parser().parse_args(argv[2:])
    assert (args.mode, args.batch_requests, args.batch_poll) == ("batch", 100, 0.5)
    assert str(args.batches_file) == "/home/u/.handoff/jobs/generator/batches.json"
    plain = build_parser().parse_args(shlex.split(render_command(role.launch, generator_vars(),
                                                                 "launch"))[2:])
    assert plain.mode == "sync" and str(plain.batches_file).endswith("/batches.json")
    cancel = build_parser().parse_args(shlex.split(render_command(role.cancel, v, "cancel"))[2:])
    assert (cancel.command, cancel.cancel, cancel.json) == ("batches", True, True)
    assert cancel.batches_file == args.batches_file
    assert cancel.api_key_file == args.api_key_file and cancel.base_url == args.base_url
    assert not get_role("extractor").cancel


def test_missing_required_var_names_it() -> None:
    with pytest.raises(RoleError, match="needs var input"):
        render_command(get_role("generator").launch, generator_vars(input=None), "launch")


def extractor_vars(**extra: object) -> dict[str, object]:
    """What launch renders with: the role's defaults under the host's vars (as targets merge)."""
    v: dict[str, object] = dict(get_role("extractor").vars)
    v.update(python="/opt/py/bin/python3", remote_dir="/home/u/.handoff", input="/d/gen out.jsonl",
             job_dir="/home/u/.handoff/jobs/extractor", gpus=8, model_dir="/models/kimi k2.5",
             shard=None)
    v.update(extra)
    return v


def extract_argv(**extra: object) -> list[str]:
    return shlex.split(render_command(get_role("extractor").launch, extractor_vars(**extra), "launch"))


def test_extractor_launch_uses_torchrun_over_ranks_defaulting_to_gpus() -> None:
    argv = extract_argv()
    assert argv[:4] == ["/opt/py/bin/python3", "-m", "torch.distributed.run", "--standalone"]
    assert argv[argv.index("--nproc-per-node") + 1] == "8"  # ranks: "{gpus}"
    assert argv[6:8] == ["/home/u/.handoff/current/payload.pyz", "extract"]
    assert argv[argv.index("--input") + 1] == "/d/gen out.jsonl"  # quoted: one argv item
    assert argv[argv.index("--model") + 1] == "/models/kimi k2.5"
    assert argv[argv.index("--output-dir") + 1] == "/home/u/.handoff/jobs/extractor/features"
    assert argv[argv.index("--status-file") + 1] == "/home/u/.handoff/jobs/extractor/status.json"
    assert argv[argv.index("--progress") + 1] == "plain"
    # every optional flag is dropped while its var is unset (the payload's defaults apply)
    for flag in ("--layers", "--max-length", "--batch-tokens", "--dtype", "--shard",
                 "--reasoning", "--overlong", "--trust-remote-code"):
        assert flag not in argv, flag


def test_extractor_launch_one_rank_over_all_gpus_and_every_option() -> None:
    argv = extract_argv(ranks=1, layers="2,16,29", max_length=4096, batch_tokens=16384,
                        dtype="float16", shard="1/3", reasoning="drop", overlong="skip",
                        trust_remote_code=True)
    assert argv[argv.index("--nproc-per-node") + 1] == "1"  # Kimi-K2.5: device_map auto
    pairs = {"--layers": "2,16,29", "--max-length": "4096", "--batch-tokens": "16384",
             "--dtype": "float16", "--shard": "1/3", "--reasoning": "drop", "--overlong": "skip"}
    for flag, value in pairs.items():
        assert argv[argv.index(flag) + 1] == value, flag
    assert argv[-1] == "--trust-remote-code"  # a switch: the flag alone, no "true" after it


def test_extractor_switch_off_and_quoting_of_hostile_values() -> None:
    argv = extract_argv(trust_remote_code=False, layers="2,16; rm -rf ~", input="/d/$(id).jsonl")
    assert "--trust-remote-code" not in argv and "false" not in argv
    assert argv[argv.index("--layers") + 1] == "2,16; rm -rf ~"  # one quoted token, not shell
    assert argv[argv.index("--input") + 1] == "/d/$(id).jsonl"


def test_extractor_launch_without_gpus_names_the_var_to_set() -> None:
    with pytest.raises(RoleError, match=r"needs var gpus; set it in the inventory \(vars: \{gpus: \.\.\.\}\)"):
        render_command(get_role("extractor").launch, extractor_vars(gpus=None), "launch")
    with pytest.raises(RoleError, match="needs var model_dir"):
        render_command(get_role("extractor").launch, extractor_vars(model_dir=None), "launch")


def test_accelerate_only_when_one_process_spans_several_gpus() -> None:
    req = get_role("extractor").requires
    assert "accelerate" not in req.modules_needed(extractor_vars())  # ranks = gpus = 8
    assert "accelerate" in req.modules_needed(extractor_vars(ranks=1))
    assert "accelerate" not in req.modules_needed(extractor_vars(ranks=1, gpus=1))
    assert "accelerate" not in req.modules_needed(extractor_vars(gpus=None))  # unknown: not asked


def test_extractor_preflight_renders_launch_flags_with_preflight_only() -> None:
    pf = get_role("extractor").preflight
    assert pf is not None
    argv = shlex.split(render_command(pf.run, extractor_vars(shard="0/2", max_length=2048), "preflight"))
    assert argv[1:4] == ["/home/u/.handoff/current/payload.pyz", "extract", "--preflight-only"]
    assert argv[argv.index("--shard") + 1] == "0/2" and argv[argv.index("--max-length") + 1] == "2048"
    assert "torch.distributed.run" not in argv  # one plain process, no GPU needed
    assert set(pf.needs) == {"{remote_dir}/current/payload.pyz", "{input}"}


def test_var_cycle_is_an_error_not_a_hang() -> None:
    with pytest.raises(RoleError, match="refers to itself"):
        render_command(("{a}",), {"a": "{b}", "b": "{a}"}, "x")


def test_role_file_validation_of_new_fields(tmp_path: Path) -> None:
    bad_when = tmp_path / "w.yml"
    bad_when.write_text("requires:\n  modules:\n    - {module: m, when: 'ranks less gpus'}\n")
    with pytest.raises(RoleError, match=rf"{bad_when}:2: modules: bad condition"):
        load_role(bad_when)
    bad_pf = tmp_path / "p.yml"
    bad_pf.write_text("preflight:\n  run: [x]\n  nedds: {}\n")
    with pytest.raises(RoleError, match=rf"{bad_pf}:3: unknown preflight key 'nedds'"):
        load_role(bad_pf)
    ok = tmp_path / "ok.yml"
    ok.write_text("requires:\n  cuda_torch: true\n  files: {'{d}/x': fix it}\n"
                  "  modules: [a, {module: b, when: '{n} >= 2', fix: get b}]\n"
                  "preflight: {run: ['{python}', check], needs: {'{d}': put d}}\n")
    role = load_role(ok)
    assert role.requires.modules_needed({"n": 2}) == ["a", "b"]
    assert role.requires.modules_needed({"n": 1}) == ["a"]
    assert role.requires.fixes == {"b": "get b"} and role.preflight is not None


def test_a_misspelt_role_key_names_line_and_suggests(tmp_path: Path) -> None:
    """Every role key is checked against the known set, with "did you mean" (issue 22 #1)."""
    path = tmp_path / "x.yml"
    path.write_text("description: x\nlanuch: [a]\n")
    with pytest.raises(RoleError, match=rf"{path}:2: unknown key 'lanuch'; did you mean 'launch'\?"):
        load_role(path)
    path.write_text("requires:\n  python: '>=3.10'\n  modulez: [a]\n")
    with pytest.raises(RoleError, match="did you mean 'modules'"):
        load_role(path)


def test_extractor_tp_defaults_to_the_hosts_gpus_for_the_vllm_backend_only() -> None:
    """`tp: "{gpus}"`: the vllm backend gets --tensor-parallel-size = the host's gpus unless
    tp is set; the hf backend (which refuses engine flags) never gets it, whatever tp is."""
    argv = extract_argv(backend="vllm", ranks=1)
    assert argv[argv.index("--backend") + 1] == "vllm"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"  # the host's gpus
    argv = extract_argv(backend="vllm", ranks=1, gpus=4, tp=2, kv_cache_memory="40G")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"  # set: it wins
    assert argv[argv.index("--kv-cache-memory") + 1] == "40G"
    for hf in ({}, {"backend": "hf"}, {"backend": "hf", "tp": 2, "kv_cache_memory": "40G"}):
        argv = extract_argv(**hf)
        assert "--tensor-parallel-size" not in argv and "--kv-cache-memory" not in argv, hf
    # gpus unset: the group drops and the payload's own default applies (every visible GPU)
    argv = extract_argv(backend="vllm", ranks=1, gpus=None)
    assert "--tensor-parallel-size" not in argv
    pf = get_role("extractor").preflight
    assert pf is not None
    argv = shlex.split(render_command(pf.run, extractor_vars(backend="vllm", gpus=2), "preflight"))
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    argv = shlex.split(render_command(pf.run, extractor_vars(tp=2), "preflight"))
    assert "--tensor-parallel-size" not in argv


def test_switch_comparisons() -> None:
    tokens = ("x", ["{?b==v}", "--on"], ["{?b!=v}", "--off"], ["{?b==v}", "--n", "{n}"])
    assert render_command(tokens, {"b": "v", "n": 3}, "t") == "x --on --n 3"
    assert render_command(tokens, {"b": "w", "n": 3}, "t") == "x --off"
    assert render_command(tokens, {"b": None}, "t") == "x --off"  # unset equals nothing
    assert render_command(tokens, {"b": "{c}", "c": "v"}, "t") == "x --on"  # vars naming vars


def test_cpu_host_is_not_asked_for_gpu_commands_and_vllm_has_a_version_range() -> None:
    from handoff.config.roles import version_in_range
    from payload.extract.backends.vllm import VLLM_BELOW, VLLM_MIN

    req = get_role("extractor").requires
    assert req.commands_needed({"gpus": 8}) == ["nvidia-smi"]
    assert req.commands_needed({"gpus": None}) == ["nvidia-smi"]  # unknown: at least one GPU
    assert req.commands_needed({"gpus": 0}) == []
    assert req.versions_needed(extractor_vars()) == {}  # hf backend: vllm not needed at all
    spec = req.versions_needed(extractor_vars(backend="vllm"))["vllm"]
    # the role's range is the payload's own (what backends/vllm.py was written against)
    assert spec == f">={VLLM_MIN[0]}.{VLLM_MIN[1]},<{VLLM_BELOW[0]}.{VLLM_BELOW[1]}"
    assert version_in_range("0.32.0", spec) and version_in_range("0.32.3+cpu", spec)
    assert not version_in_range("0.33.0", spec) and not version_in_range("0.31.9", spec)
    assert not version_in_range("dev", spec)
    assert version_in_range("0.32.1", "==0.32") and not version_in_range("0.3", "==0.32")


def test_role_file_validation_of_commands_and_versions(tmp_path: Path) -> None:
    bad = tmp_path / "c.yml"
    bad.write_text("requires:\n  commands:\n    - {comand: x}\n")
    with pytest.raises(RoleError, match="unknown command key 'comand'"):
        load_role(bad)
    bad.write_text("requires:\n  modules:\n    - {module: m, version: 'about 1'}\n")
    with pytest.raises(RoleError, match=r"bad version range 'about 1'"):
        load_role(bad)


def test_text_from_a_host_is_never_rendered_again() -> None:
    """Issue 31, finding 11: a var holding host text (`Text`: a path made from the home a
    host reported) is filled in as it is, whatever `{…}` it holds."""
    from handoff.config.templates import Text, render_value

    lie = "/home/u/{base_url:>300000000}/.handoff"
    variables = {"remote_dir": Text(lie), "base_url": "http://x"}
    assert render_value("{remote_dir}/jobs", variables) == lie + "/jobs"
    assert render_value("{plain}", {"plain": "{base_url}", "base_url": "b"}) == "b"  # vars naming vars
