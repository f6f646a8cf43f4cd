"""verify's verdict for the extractor role from probe facts, without a host.

The probe's JSON answer (handoff.host.remote_code.probe) is what these facts imitate, typed by
Facts.from_json as the real answer is; each failing check must carry the numbers it saw
and a fix a person can act on.
"""

from __future__ import annotations

import json
from typing import Any

from handoff.config.roles import get_role
from handoff.host.facts import SELF_PYTHON, Facts, deep_args
from handoff.ops.verify import Check, Verdict, evaluate

ROLE = get_role("extractor")
GIB = 1 << 30


def host_vars(**extra: Any) -> dict[str, Any]:
    v: dict[str, Any] = dict(ROLE.vars)
    v.update(python="python3", remote_dir="~/.handoff", gpus=8, model_dir="/models/kimi",
             input="~/.handoff/data/out.jsonl")
    v.update(extra)
    return v


def facts(**extra: Any) -> Facts:
    """A healthy 8-GPU host; keyword arguments replace parts of the probe's answer."""
    raw: dict[str, Any] = {
        "python": [3, 11, 9], "executable": "/usr/bin/python3", "home": "/root", "uid": 0,
        "modules": {"torch": True, "transformers": True, "safetensors": True, "tokenizers": True},
        "commands": {"nvidia-smi": "/usr/bin/nvidia-smi"},
        "gpus": [f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})" for i in range(8)],
        "disk_free": 900 * GIB,
        "torch": {"torch": "2.13.0+cu128", "cuda": "12.8", "available": True, "gpus": 8},
        "need": {"{model_dir}/config.json": {"path": "/models/kimi/config.json", "exists": True}},
        "preflight": preflight_result(fits=True),
        "preflight_wanted": True,
    }
    raw.update(extra)
    return Facts.from_json(raw)


def preflight_result(fits: bool, rc: int | None = None, **extra: Any) -> dict[str, Any]:
    line = {"samples": 1000, "tokens": 2_500_000, "estimate_bytes": 430 * GIB,
            "bytes_per_token": 172032, "already_done": 10, "free_bytes": 900 * GIB if fits else 200 * GIB,
            "reserve_bytes": GIB, "fits": fits, **extra}
    return {"rc": (0 if fits else 2) if rc is None else rc, "out": json.dumps(line) + "\n", "err": ""}


def check(verdict: Verdict, prefix: str) -> Check:
    found = [c for c in verdict.checks if c.name.startswith(prefix)]
    assert len(found) == 1, [c.name for c in verdict.checks]
    return found[0]


def test_healthy_host_passes_every_check() -> None:
    verdict = evaluate(facts(), ROLE, host_vars())
    assert verdict.ok, [(c.name, c.have, c.fix) for c in verdict.missing]
    names = [c.name for c in verdict.checks]
    for want in ("module torch", "module tokenizers", "command nvidia-smi", "CUDA GPUs",
                 "CUDA via torch", "file /models/kimi/config.json", "disk for the features"):
        assert want in names
    assert "module accelerate" not in names  # ranks = gpus: one process per GPU


def test_no_torch_fails_modules_and_cuda_with_fixes() -> None:
    mods = {"torch": False, "transformers": False, "safetensors": False, "tokenizers": True}
    verdict = evaluate(facts(modules=mods, torch=None, commands={"nvidia-smi": None}, gpus=None),
                       ROLE, host_vars(python="/opt/py/bin/python3"))
    assert not verdict.ok
    missing = {c.name: c for c in verdict.missing}
    assert {"module torch", "module transformers", "module safetensors", "CUDA via torch",
            "CUDA GPUs", "command nvidia-smi"} <= set(missing)
    assert "/opt/py/bin/python3 -m pip install torch --index-url" in missing["module torch"].fix
    assert missing["module torch"].installable is None  # never pip-installed blindly (CUDA match)
    assert "pip install" in missing["module transformers"].fix
    assert missing["CUDA via torch"].have == "not checked: torch is missing"


def test_cpu_build_of_torch_is_no_cuda() -> None:
    cpu = {"torch": "2.13.0+cpu", "cuda": None, "available": False, "gpus": 0}
    c = check(evaluate(facts(torch=cpu), ROLE, host_vars()), "CUDA via torch")
    assert not c.ok and "none (CPU build)" in c.have and "CPU build" in c.fix


def test_cuda_build_that_sees_no_gpu_points_at_the_driver() -> None:
    blind = {"torch": "2.13.0+cu128", "cuda": "12.8", "available": False, "gpus": 0}
    c = check(evaluate(facts(torch=blind), ROLE, host_vars()), "CUDA via torch")
    assert not c.ok and "driver" in c.fix and "12.8" in c.fix


def test_too_few_gpus_says_how_many_there_are() -> None:
    four = {"torch": "2.13.0+cu128", "cuda": "12.8", "available": True, "gpus": 4}
    verdict = evaluate(facts(torch=four, gpus=[f"GPU {i}: x" for i in range(4)]), ROLE, host_vars())
    torch_check, smi_check = check(verdict, "CUDA via torch"), check(verdict, "CUDA GPUs")
    assert not torch_check.ok and torch_check.want == "available, >= 8 GPU(s)"
    assert "4 GPU(s)" in torch_check.have and "at most 4" in torch_check.fix
    assert not smi_check.ok and smi_check.have == "4"


def test_one_rank_over_all_gpus_needs_accelerate() -> None:
    verdict = evaluate(facts(modules={"torch": True, "transformers": True, "safetensors": True,
                                      "tokenizers": True, "accelerate": False}),
                       ROLE, host_vars(ranks=1))
    c = check(verdict, "module accelerate")
    assert not c.ok and "pip install accelerate" in c.fix and "ranks < gpus" in c.fix


def test_missing_model_dir() -> None:
    gone = {"{model_dir}/config.json": {"path": "/models/kimi/config.json", "exists": False}}
    c = check(evaluate(facts(need=gone), ROLE, host_vars()), "file /models/kimi/config.json")
    assert not c.ok and c.have == "missing" and "model_dir" in c.fix
    unset = check(evaluate(facts(need={}), ROLE, host_vars(model_dir=None)), "file {model_dir}")
    assert not unset.ok and unset.have == "var model_dir unset"


def test_preflight_fits_shows_the_numbers() -> None:
    c = check(evaluate(facts(), ROLE, host_vars()), "disk for the features")
    assert c.ok and not c.skipped
    assert "461.7 GB for 1000 samples / 2500000 tokens" in c.have and "966.4 GB free" in c.have


def test_preflight_does_not_fit_fails_with_numbers_and_fix() -> None:
    verdict = evaluate(facts(preflight=preflight_result(fits=False)), ROLE, host_vars())
    c = check(verdict, "disk for the features")
    assert not c.ok and not verdict.ok
    assert "214.7 GB free" in c.have and "172032 B/token" in c.have and "10 already done" in c.have
    assert c.fix.startswith("needs 462.8 GB but 214.7 GB free under ~/.handoff/jobs/extractor")
    assert "bigger volume" in c.fix and "more hosts" in c.fix


def test_preflight_shows_the_stored_form_and_points_speculators_at_fp8() -> None:
    """The payload's verdict names what the files hold (fp8, gzip); a speculators job
    that does not fit in bf16 is told that fp8 halves it, an fp8 one is not."""
    bf16 = preflight_result(fits=False, format="speculators", feature_dtype="bfloat16")
    c = check(evaluate(facts(preflight=bf16), ROLE, host_vars()), "disk for the features")
    assert "172032 B/token, bfloat16, 10 already done" in c.have
    assert "`feature_dtype: fp8`" in c.fix
    fp8 = preflight_result(fits=False, format="speculators", feature_dtype="float8_e4m3fn")
    c = check(evaluate(facts(preflight=fp8), ROLE, host_vars()), "disk for the features")
    assert "float8_e4m3fn" in c.have and "fp8" not in c.fix
    gz = preflight_result(fits=True, format="specforge", feature_dtype="bfloat16",
                          compress="gzip")
    c = check(evaluate(facts(preflight=gz), ROLE, host_vars()), "disk for the features")
    assert c.ok and "B/token, bfloat16, gzip," in c.have


def test_preflight_crash_shows_its_error_and_the_command_to_rerun() -> None:
    crash = {"rc": 2, "out": "", "err": "extract: --model /models/kimi: no config.json\n"}
    c = check(evaluate(facts(preflight=crash), ROLE, host_vars()), "disk for the features")
    assert not c.ok and "exit 2" in c.have and "no config.json" in c.have
    assert 'python3 "$HOME"/.handoff/current/payload.pyz extract --preflight-only' in c.fix
    assert SELF_PYTHON not in c.fix


def test_preflight_before_push_or_input_is_skipped_with_the_fix() -> None:
    missing = {"missing": ["{remote_dir}/current/payload.pyz", "{input}"]}
    verdict = evaluate(facts(preflight=missing), ROLE, host_vars())
    c = check(verdict, "disk for the features")
    assert c.ok and c.skipped and verdict.ok  # deploy verifies before it pushes: not a failure
    assert "~/.handoff/current/payload.pyz" in c.have and "~/.handoff/data/out.jsonl" in c.have
    assert "fab push-script" in c.fix and "fab launch --role extractor --input" in c.fix


def test_preflight_without_an_input_var_is_skipped_and_says_which_var() -> None:
    c = check(evaluate(facts(preflight=None), ROLE, host_vars(input=None)), "disk for the features")
    assert c.ok and c.skipped and c.have == "not run: var input unset" and "input" in c.fix


def test_deep_args_render_the_preflight_for_this_hosts_shard() -> None:
    args = deep_args(ROLE, host_vars(max_length=2048), "1/4")
    pf = args["preflight"]
    assert pf["argv"][0] == SELF_PYTHON  # the probe runs it with the python it checked
    assert pf["argv"][1:4] == ["~/.handoff/current/payload.pyz", "extract", "--preflight-only"]
    assert pf["argv"][pf["argv"].index("--shard") + 1] == "1/4"
    assert pf["argv"][pf["argv"].index("--output-dir") + 1] == "~/.handoff/jobs/extractor/features"
    assert pf["needs"] == {"{remote_dir}/current/payload.pyz": "~/.handoff/current/payload.pyz",
                           "{input}": "~/.handoff/data/out.jsonl"}
    assert args["need"] == {"{model_dir}/config.json": "/models/kimi/config.json"}
    assert args["torch_cuda"] is True
    assert "preflight" not in deep_args(ROLE, host_vars(input=None), None)  # nothing to run


def test_generator_verify_stays_one_cheap_probe() -> None:
    gen = get_role("generator")
    args = deep_args(gen, {"remote_dir": "~/.handoff", "python": "python3"}, None)
    assert args["torch_cuda"] is False and args["need"] == {} and "preflight" not in args


def test_deploy_does_not_run_the_preflight() -> None:
    args = deep_args(ROLE, host_vars(), None, preflight=False)
    assert "preflight" not in args and args["preflight_wanted"] is False
    verdict = evaluate(facts(preflight=None, preflight_wanted=False), ROLE, host_vars())
    assert verdict.ok and not [c for c in verdict.checks if c.name == "disk for the features"]


def test_vllm_backend_checks_the_version_range_and_cpu_host_skips_cuda() -> None:
    """backend: vllm asks the probe for vllm's __version__ (in the pinned range); a CPU
    host (gpus: 0) is asked for no nvidia-smi, no GPU count and no CUDA through torch."""
    mods = {"torch": True, "transformers": True, "safetensors": True, "tokenizers": True,
            "vllm": True}
    cpu = host_vars(backend="vllm", gpus=0, ranks=1, tp=1)
    args = deep_args(ROLE, cpu, None)
    assert args["versions"] == ["vllm"] and args["torch_cuda"] is False
    assert deep_args(ROLE, host_vars(), None)["versions"] == []  # hf: vllm not imported
    ok = evaluate(facts(modules=mods, commands={}, gpus=None, torch=None,
                        versions={"vllm": {"version": "0.32.0"}}), ROLE, cpu)
    assert not ok.missing, [(c.name, c.have, c.fix) for c in ok.missing]
    names = [c.name for c in ok.checks]
    assert "vllm version" in names and "CUDA GPUs" not in names and "CUDA via torch" not in names
    old = evaluate(facts(modules=mods, commands={}, gpus=None, torch=None,
                         versions={"vllm": {"version": "0.31.2"}}), ROLE, cpu)
    row = check(old, "vllm version")
    assert not row.ok and row.have == "0.31.2" and row.want == ">=0.32,<0.33"
    assert "pip install 'vllm==0.32.*'" in row.fix
    broken = evaluate(facts(modules=mods, commands={}, gpus=None, torch=None,
                            versions={"vllm": {"error": "ImportError: libcuda.so.1"}}), ROLE, cpu)
    row = check(broken, "vllm version")
    assert not row.ok and "libcuda.so.1" in row.have
    # a GPU host with backend vllm still gets every GPU check
    gpu = evaluate(facts(modules=mods, versions={"vllm": {"version": "0.32.0"}}), ROLE,
                   host_vars(backend="vllm", ranks=1))
    assert not gpu.missing and {"CUDA GPUs", "CUDA via torch", "command nvidia-smi",
                                "vllm version"} <= {c.name for c in gpu.checks}
