"""The payload: what runs ON the containers (`python -m payload …` / `python payload.pyz …`).

Stdlib + aiohttp for `generate` and `smoke`; torch/transformers/safetensors only for
`extract`, imported lazily so a generator container never needs them. This package
never imports `handoff`: it is zipped and shipped alone.
"""

__version__ = "0.1.0"
