"""Type-check the package ``kernelab`` with mypy: ``python .ci/typecheck.py [MYPY OPTIONS]``.

kernelab's subpackages are the repository's top-level folders, mapped by
``[tool.setuptools.package-dir]`` in pyproject.toml (``kernelab.service`` is ``service/``). Python
imports them through setuptools' editable-install hook (or from a wheel, where they are real
folders), but mypy finds modules by walking folders only and does not run import hooks
(python/mypy#13392, pypa/setuptools#3518): a plain ``mypy -p kernelab`` in the checkout finds
``kernelab/__init__.py`` and none of the subpackages.

So this script lays the package out as a wheel holds it, in a temporary folder outside the
repository: ``kernelab/`` there holds a symbolic link to each entry of the checkout's ``kernelab/``
and, for each mapped subpackage, a link named after it to its folder (``kernelab/service ->
<checkout>/service``). It runs ``mypy -p kernelab`` there (this Python's mypy, the checkout's
pyproject.toml configuration and ``.mypy_cache``), so mypy checks the checkout's own files, every
module of the package, under the names they are imported by. In mypy's output a path is written
back as the checkout's (``kernelab/kernelab/app.py`` -> ``kernelab/app.py``). The folder is removed
afterwards; nothing is written into the checkout but mypy's cache.

Exit status: mypy's (0: no error; 1: type errors; 2: a fatal error). ``SystemExit`` with a message
when pyproject.toml maps a package to a folder that does not exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernelab"


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``[tool.setuptools.package-dir]`` of ``root/pyproject.toml``: package name -> its folder
    (absolute). ``SystemExit`` when a mapped folder does not exist."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out = {name: (root / folder).resolve() for name, folder in table.items()}
    for name, folder in out.items():
        if not folder.is_dir():
            raise SystemExit(f"pyproject.toml maps {name!r} to {folder}, which is not a folder")
    return out


def lay_out(dirs: dict[str, Path], dest: Path) -> dict[str, str]:
    """Make under ``dest`` the folder tree of the installed packages ``dirs`` (name -> folder): a
    package with no mapped package inside it is one link to its folder; one with mapped packages
    inside it (``kernelab``) a real folder of links to its folder's entries (less ``__pycache__``)
    and to those packages. Returns, for the output, each laid-out prefix (``kernelab/service/``)
    -> the folder's path relative to the checkout (``service/``)."""
    prefixes = {}
    for name in sorted(dirs, key=lambda n: n.count(".")):
        folder = dirs[name]
        target = dest.joinpath(*name.split("."))
        if any(other.startswith(name + ".") for other in dirs):
            target.mkdir(parents=True)
            for entry in folder.iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():  # a link of the parent's entries (a folder also mapped)
                target.unlink()
            target.symlink_to(folder, target_is_directory=True)
        prefixes[name.replace(".", "/") + "/"] = f"{os.path.relpath(folder, ROOT)}/"
    return prefixes


def main(argv: list[str]) -> int:
    prefixes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kernelab-mypy-") as tmp:
        prefixes = lay_out(package_dirs(), Path(tmp))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "--cache-dir",
                str(ROOT / ".mypy_cache"),
                *argv,
                "-p",
                PACKAGE,
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
    # longest prefix first: kernelab/service/ before kernelab/
    pattern = re.compile(
        r"^(" + "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True)) + r")", re.M
    )
    for stream, text in ((sys.stdout, done.stdout), (sys.stderr, done.stderr)):
        stream.write(pattern.sub(lambda m: prefixes[m.group(1)], text))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
