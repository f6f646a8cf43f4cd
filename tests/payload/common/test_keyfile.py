"""The key on the container: a key file readable by others is refused (naming the chmod),
`--consume-key` deletes it once read, `$OPENROUTER_API_KEY` stands in for it (payload/keyfile.py)."""

from __future__ import annotations

import pytest

from tests.payload.helpers import (
    gen_args,
    run_payload,
    write_private,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_key_file_mode_is_enforced_and_consumed(fake_factory, tmp_path, api_key):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 5)
    loose = write_private(tmp_path / "loose.key", api_key, 0o644)
    proc = run_payload(*gen_args(fake, loose, inp, out))
    assert proc.returncode == 2
    assert f"chmod 600 {loose}" in proc.stderr
    assert fake.stats.requests == 0
    tight = write_private(tmp_path / "tight.key", api_key)
    proc = run_payload(*gen_args(fake, tight, inp, out, "--consume-key"))
    assert proc.returncode == 0, proc.stderr
    assert not tight.exists()
    # Without a file the key comes from $OPENROUTER_API_KEY.
    args = gen_args(fake, tight, inp, tmp_path / "out2.jsonl")
    i = args.index("--api-key-file")
    del args[i:i + 2]
    proc = run_payload(*args, env={"OPENROUTER_API_KEY": api_key})
    assert proc.returncode == 0, proc.stderr
    proc = run_payload(*args)
    assert proc.returncode == 2 and "OPENROUTER_API_KEY" in proc.stderr
