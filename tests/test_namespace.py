"""One namespace: kernelab installs only ``kernelab``; a user's ``kernels``/``service`` never collides.

The shadow test puts packages named like kernelab's rooms first on ``PYTHONPATH`` (each raises
when imported) and runs the CLI, the server's app factory and a CPU measurement through them. The
wheel tests build kernelab's wheel (from a copy of the sources: no ``build/`` is left in the
checkout) and install it into a bare virtual environment: it holds every file of the mapped folders
(``[tool.setuptools.package-dir]``), the only top-level names it may add are ``kernelab`` and its
``dist-info``, and with the dependencies on the path the CLI, every module and the pytest plugin
run from it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import kernelab

pytestmark = pytest.mark.slow  # a fresh venv and pip install

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("kernels", "service", "runners", "web", "migrations")


@pytest.fixture
def shadowed_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``PYTHONPATH`` starts with packages named like kernelab's rooms."""
    shadow = tmp_path / "user-repo"
    for name in ROOMS:
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ImportError('the user repository\\'s own {name!r} package was imported')\n"
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    return env


def _kernelab(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_user_package_named_kernels_does_not_disturb_kernelab(
    shadowed_env: dict[str, str], tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        textwrap.dedent(
            """\
            name: shadowed
            benchmark: softmax
            baseline: {variant: torch}
            candidate: {variant: torch}
            sweep: {M: [8], N: [16], dtype: [float32]}
            measurement: {warmup_ms: 1, budget_ms: 30, min_rounds: 6, max_rounds: 20}
            probes: {copy_bandwidth: false, all_reduce: false, nvml: false}
            """
        )
    )
    validated = _kernelab(shadowed_env, tmp_path, "validate", str(spec))
    assert validated.returncode == 0, validated.stderr
    ran = _kernelab(shadowed_env, tmp_path, "run", str(spec), "--json", str(tmp_path / "out.json"))
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "out.json").is_file()
    # The server side: the app factory, the dashboard, the migrations, the daemon.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from kernelab.app import create_app\n"
            "import kernelab.runners.daemon, kernelab.web.routes, kernelab.migrations\n"
            "create_app\n"
            f"print(sorted(set(sys.modules) & {set(ROOMS)!r}))\n",
        ],
        env=shadowed_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def _package_dirs() -> dict[str, Path]:
    """``[tool.setuptools.package-dir]`` of pyproject.toml: package -> its folder in the checkout."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in table.items()}


def _module_names() -> set[str]:
    """The modules of the checkout's mapped folders, as ``pkgutil.walk_packages`` lists them: each
    ``.py`` file whose folders up to the mapped one are packages (``migrations/versions/`` is not)."""
    out = set()
    for package, folder in _package_dirs().items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder)
            if all(
                (folder.joinpath(*rel.parts[:i]) / "__init__.py").is_file() for i in range(len(rel.parts))
            ):
                parts = [*package.split("."), *rel.with_suffix("").parts]
                out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernelab's wheel (``pip wheel``), built from a copy of the build's inputs (pyproject.toml,
    setup.py, README.md, the mapped folders): a build in the checkout would leave ``build/lib``, a
    second copy of the code, and ``kernelab.egg-info`` there."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in _package_dirs().values():
        shutil.copytree(folder, source / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-w", str(out), str(source)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    [path] = out.glob("kernelab-*.whl")
    return path


def _venv(path: Path, wheel: Path) -> tuple[Path, Path]:
    """A bare virtual environment at ``path`` (no pip) with ``wheel`` installed, no dependencies:
    (its python, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    return python, site


def test_the_wheel_installs_only_the_kernelab_package(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"kernelab", f"kernelab-{kernelab.__version__}.dist-info"}
    # the mapped folders are real folders in the wheel, each file of theirs there: every module of
    # every subpackage and the package data (templates, static files, runner examples, the
    # migrations with versions/, alembic.ini and script.py.mako, service/contract/builtin_adverts.json)
    assert set(_package_dirs()) == {"kernelab", *(f"kernelab.{room}" for room in ROOMS)}
    expected = {
        "/".join([*package.split("."), *path.relative_to(folder).parts])
        for package, folder in _package_dirs().items()
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    data = ("kernelab/web/templates/base.html", "kernelab/service/contract/builtin_adverts.json")
    for path in ("kernelab/app.py", "kernelab/migrations/versions/0001_initial.py", *data):
        assert path in expected, path  # the walk above sees the rooms
    assert {n for n in names if not n.startswith(f"kernelab-{kernelab.__version__}.dist-info/")} == expected
    python, site = _venv(tmp_path / "venv", wheel)
    added = {p.name for p in site.iterdir()} - {"__pycache__"}
    assert added == {"kernelab", f"kernelab-{kernelab.__version__}.dist-info"}
    # ``import kernelab`` alone needs nothing else (the public names load on first use)
    version = subprocess.run(
        [str(python), "-I", "-c", "import kernelab; print(kernelab.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout.strip() == kernelab.__version__, version.stderr


# Run in the wheel's environment: every module of the installed package imports from there (the
# Alembic environment script ``kernelab.migrations.env`` runs only under Alembic), and the pytest
# plugin's entry point loads the installed module.
_INSTALLED_CHECK = """\
import importlib, importlib.metadata, json, pkgutil, sys
import kernelab
names = ["kernelab", *(m.name for m in pkgutil.walk_packages(kernelab.__path__, "kernelab."))]
for name in names:
    if not name.endswith(("__main__", "kernelab.migrations.env")):
        importlib.import_module(name)
[plugin] = importlib.metadata.entry_points(group="pytest11", name="kernelab")
files = {name: getattr(sys.modules.get(name), "__file__", None) for name in names}
print(json.dumps({"files": files, "plugin": plugin.load().__file__}))
"""


def test_the_installed_wheel_runs(wheel: Path, tmp_path: Path) -> None:
    """The wheel in a virtual environment of its own, the dependencies seen through a ``.pth``
    entry of this environment's site-packages (a path entry only: an editable install's import hook
    there does not run): ``kernelab --version``, ``python -m kernelab --help``, every module and
    the pytest plugin come from the installed package."""
    python, site = _venv(tmp_path / "venv", wheel)
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("\n".join(deps) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = tmp_path / "venv" / "bin" / "kernelab"
    run = {"capture_output": True, "text": True, "env": env, "cwd": tmp_path}
    ran = subprocess.run([str(script), "--version"], timeout=120, **run)
    assert ran.returncode == 0, ran.stderr
    assert kernelab.__version__ in ran.stdout
    ran = subprocess.run([str(python), "-m", "kernelab", "--help"], timeout=120, **run)
    assert ran.returncode == 0, ran.stderr
    assert "runner" in ran.stdout and "submit" in ran.stdout
    ran = subprocess.run([str(python), "-c", _INSTALLED_CHECK], timeout=300, **run)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert set(out["files"]) == _module_names()  # every module of the package, not only kernelab/
    outside = {name: file for name, file in out["files"].items() if file and not file.startswith(str(site))}
    assert outside == {}
    assert out["plugin"] == str(site / "kernelab" / "runners" / "pytest_plugin.py")


def test_a_checkout_on_the_path_with_another_installed_is_refused(tmp_path: Path) -> None:
    """``kernelab/`` of one tree first on ``PYTHONPATH`` while this environment's install maps the
    subpackages to another: ``import kernelab`` raises, naming both, instead of running one tree's
    ``kernelab/`` with the other's ``service/``."""
    other = tmp_path / "other-checkout"
    shutil.copytree(ROOT / "kernelab", other / "kernelab", ignore=shutil.ignore_patterns("__pycache__"))
    installed = Path(kernelab.__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(other)}
    ran = subprocess.run(
        [sys.executable, "-c", "import kernelab"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 1
    assert f"kernelab is imported from {other / 'kernelab'} but kernelab.service from" in ran.stderr
    spec = importlib.util.find_spec("kernelab.service")
    assert spec is not None and spec.origin is not None
    service = Path(spec.origin).resolve().parent
    assert str(service) in ran.stderr and service != other / "service"
    # the same folder imported from where it is installed is fine
    env["PYTHONPATH"] = str(installed.parent)
    ran = subprocess.run([sys.executable, "-c", "import kernelab"], env=env, cwd=tmp_path, timeout=60)
    assert ran.returncode == 0


def test_the_public_api_names_resolve() -> None:
    for name in kernelab.__all__:
        assert getattr(kernelab, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Benchmrk'"):
        kernelab.Benchmrk  # noqa: B018


def test_no_symlink_in_the_repository() -> None:
    """No tracked file is a symbolic link (git mode 120000): path-reading tools see every file once,
    where it is. The example specs under ``examples/`` are copies of the bundled ones, held equal by
    ``tests/runners/test_cli.py``."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    assert [line.split("\t")[-1] for line in listed.stdout.splitlines() if line.startswith("120000")] == []
