"""Test support that `fab demo`, the test suite and the benchmarks share; not the product.

- `fakeapi`: a fake OpenRouter (the HTTP seam the payload is tested against).
- `sandbox`: sshd "containers" on loopback with throwaway users, a throwaway keyring and
  the fake API (needs root: it runs `useradd`).

Nothing in the control plane imports this package except `handoff.demo`.
"""
