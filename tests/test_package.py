"""Packaging: `import dpcost` stays light, and environment.yml matches pyproject.toml."""

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["torch", "sympy", "matplotlib", "ipywidgets", "numpy"]


def test_import_dpcost_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import dpcost; "
        "print(time.perf_counter() - t); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[1] == "[]", f"import dpcost pulled in {out[1]}"
    # Generous bound for a loaded CI machine; typically a few ms.
    assert float(out[0]) < 0.15


def _pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return dict(r.split("==") for r in requirements)


def _environment_pins():
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        match = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)\s*={1,2}\s*([0-9][^\s#]*)", line)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def test_environment_yml_matches_pyproject():
    pyproject, environment = _pyproject_pins(), _environment_pins()
    assert all("==" not in v for v in pyproject.values())
    for name, version in pyproject.items():
        assert environment.get(name) == version, f"{name}: environment.yml has " \
            f"{environment.get(name)}, pyproject.toml has {version}"
    assert set(environment) - set(pyproject) == {"python"}
    assert "-e ." in (ROOT / "environment.yml").read_text()
