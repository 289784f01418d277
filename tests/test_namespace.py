"""One namespace: kernelab installs only ``kernelab``; a user's ``kernels``/``service`` never collides.

The shadow test puts packages named like kernelab's rooms first on ``PYTHONPATH`` (each raises
when imported) and runs the CLI, the server's app factory and a CPU measurement through them. The
wheel test builds kernelab's wheel and installs it into a bare virtual environment: the only
top-level names it may add are ``kernelab`` and its ``dist-info``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
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


def test_the_wheel_installs_only_the_kernelab_package(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("kernelab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"kernelab", f"kernelab-{kernelab.__version__}.dist-info"}
    # the rooms are real folders in the wheel, with their package data
    for path in (
        "kernelab/kernelab/app.py",
        "kernelab/web/templates/base.html",
        "kernelab/migrations/alembic.ini",
        "kernelab/migrations/versions/0001_initial.py",
        "kernelab/runners/examples/softmax.yaml",
        "kernelab/kernels/triton_kernels/softmax.py",
    ):
        assert path in names, path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
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


def test_the_public_api_names_resolve() -> None:
    for name in kernelab.__all__:
        assert getattr(kernelab, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Benchmrk'"):
        kernelab.Benchmrk  # noqa: B018
