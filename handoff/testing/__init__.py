"""Test support that `fab demo`, the test suite and the benchmarks share; not the product.

- `fakeapi`: a fake OpenRouter (the HTTP seam the payload is tested against).
- `sandbox`: sshd "containers" on loopback with throwaway users, a throwaway keyring and
  the fake API (needs root: it runs `useradd`).
- `local`: `LocalSession`, a Session whose "host" is a temp dir on this machine, for unit
  tests of per-host logic without sshd.

Nothing in the control plane imports this package except `handoff.cli.demo` (the demo is a run
against the sandbox); tests/test_layers.py checks it.
"""
