"""Builds the probe client's optional C record write (probe_client/_accel.c).

Everything else is declared in pyproject.toml. The extension is optional:
without a compiler or Python headers the install goes on and the probe
client uses its standard-library path (`probe_client.ACCELERATOR` says which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "probe_client._accel",
            sources=["probe_client/_accel.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
