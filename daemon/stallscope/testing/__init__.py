"""Test doubles the tests, benches, scripts and demo share: a fake NVML
function table behind the real bindings (`fake_nvml`) and a raw-wire flood
sender (`flood`). No product module imports this package (tests/test_layout.py
checks it)."""
