"""pip-install modules into a venv under remote_dir, for `fab verify --install` (runs ON
the host; stdlib only).

The venv sees the system site-packages (a CUDA torch installed by the image stays usable)
and is created once; later runs only pip-install into it. Once it exists, every snippet
and job of handoff runs with its python (see Session.python_command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def install(a: dict[str, Any]) -> dict[str, Any]:
    import venv

    folder = os.path.expanduser(a["venv"]) if a["venv"].startswith("~") else a["venv"]
    python = os.path.join(folder, "bin", "python")
    if not os.path.exists(python):
        os.umask(0o077)  # the venv is the login user's alone: nobody else may change what runs
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(folder)
    # The mark that handoff made this venv (handoff.defaults.VENV_MARKER): a venv/ someone
    # else left under remote_dir is never run.
    with open(os.path.join(folder, ".handoff-venv"), "w") as fh:
        fh.write("made by fab verify --install\n")
    proc = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           *a["reqs"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return {"rc": proc.returncode, "out": proc.stdout.decode(errors="replace")[-2000:],
            "python": python}


def main(argv: list[str]) -> int:
    print(json.dumps(install(eval(argv[1], {"__builtins__": {}}))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
