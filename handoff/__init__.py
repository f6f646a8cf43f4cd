"""handoff: the control plane that hands an LLM data-generation workload to remote containers.

Runs on the workstation. The public surface is small; `fabfile.py` is a thin CLI
over it. The payload that runs on the containers lives in the sibling package
`payload` and never imports this one.
"""

__version__ = "0.1.0"
