"""lumen.fast.kernels: the speed wing's C++ library is built from files an installed lumen holds."""

from __future__ import annotations

import re
from pathlib import Path

from lumen.fast import kernels
from lumen.files import read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_ships_every_file_the_kernels_are_built_from():
    """An installed lumen builds the library on the user's machine: the package data holds its sources and
    every header they include (read from the sources), else wherever lumen is installed rather than checked
    out it would fall back to torch's slower formula."""
    included = {name for s in kernels.SOURCES for name in re.findall(r'#include "([^"]+)"', s.read_text())}
    assert included and included <= {h.name for h in kernels.HEADERS}
    shipped = read_toml(ROOT / "pyproject.toml", "pyproject.toml")["tool"]["setuptools"]["package-data"]["lumen.fast"]
    assert {p.name for p in (*kernels.SOURCES, *kernels.HEADERS)} <= set(shipped)
