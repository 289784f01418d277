"""The package list of kernelab's build; everything else is configured in pyproject.toml.

kernelab's subpackages are the repository's top-level folders, mapped by
``[tool.setuptools.package-dir]`` in pyproject.toml (``kernelab.service`` is ``service/``).
setuptools' ``packages.find`` names a package after its folder (``service.server``, not
``kernelab.service.server``), so the list is made here: each mapped package, and below its folder
every folder with an ``__init__.py``, named under it (``service/server/`` is
``kernelab.service.server``).
A new subpackage is therefore built without an entry anywhere. Folders without ``__init__.py``
(``migrations/versions/``, ``web/templates/``) are package data (``[tool.setuptools.package-data]``).
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
PACKAGE_DIR: dict[str, str] = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]

packages = []
for package, folder in PACKAGE_DIR.items():
    if not (HERE / folder / "__init__.py").is_file():
        raise SystemExit(f"pyproject.toml maps {package!r} to {folder!r}, which has no __init__.py")
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(str(HERE / folder)))]

setup(packages=sorted(packages))
