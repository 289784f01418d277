"""The benchmarks this runner offers, as the advertisement it sends with every claim.

A runner offers the built-in benchmarks, every benchmark of the ``kernelab.benchmarks``
entry-point group installed beside it, and the ``module:object`` references it was started with
(``kernelab runner --benchmark mypkg.bench:MyBenchmark``, or ``KERNELAB_BENCHMARKS``, a comma
list). Each is imported here, on the runner, and described by
``kernelab.service.contract.adverts.BenchmarkAdvert``; the server checks specs against these descriptions
and never imports benchmark code.

The daemon never imports benchmark code itself: it runs ``python -m kernelab.runners.adverts
--print REF...`` as a child process, isolated as its jobs are (``Runner.advertise``), and reads the
advertisement from its stdout. ``--write`` regenerates the built-ins' advertisement that ships
with the server (``service/contract/builtin_adverts.json``); ``--check`` exits 1 when it is stale.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from kernelab.kernels.base import (
    _BUILTINS,
    BenchmarkError,
    _entry_point_benchmarks,
    get_benchmark,
    params_json_schema,
)
from kernelab.runners.reaper import become_subreaper, die_with_parent, kill_descendants
from kernelab.service.contract.adverts import BUILTIN_ADVERTS, BenchmarkAdvert, RunnerAdverts

log = logging.getLogger(__name__)


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, read once per process: it parses the
    metadata and file list of every installed distribution (0.3 s with ~250 installed, a cost the
    listing otherwise paid once per benchmark)."""
    from importlib.metadata import packages_distributions

    return dict(packages_distributions())


def _distribution_version(module: str) -> str:
    """The installed version of the distribution that provides top-level package ``module``, or
    ``"unknown"`` (a module on ``sys.path`` that no distribution installed)."""
    for dist in _packages_distributions().get(module.partition(".")[0], []):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def code_version(obj: Any) -> str:
    """``"<distribution> <version>+<sha256 of the module's source, 12 hex>"`` of the class (or the
    instance's class) ``obj``: two runners with equal code versions run the same benchmark code."""
    cls = obj if isinstance(obj, type) else type(obj)
    module = sys.modules.get(cls.__module__)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        source = ""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return f"{_distribution_version(cls.__module__)}+{digest}"


def advert_for(names: Sequence[str], *, with_version: bool = True) -> BenchmarkAdvert:
    """Import the benchmark ``names[0]`` names and describe it: ``names`` are the spec strings
    that resolve to it. Raises ``kernelab.kernels.BenchmarkError`` when it does not load."""
    bench = get_benchmark(names[0])
    return BenchmarkAdvert(
        names=list(dict.fromkeys(names)),
        variants=list(bench.variants),
        params_schema=params_json_schema(bench.Params),
        code_version=code_version(bench) if with_version else None,
        description=str(getattr(bench, "description", "") or "")[:2000],
    )


def builtin_adverts(*, with_version: bool = True) -> list[BenchmarkAdvert]:
    """The built-in benchmarks, each under its name and its ``module:object``."""
    return [advert_for([name, ref], with_version=with_version) for name, ref in sorted(_BUILTINS.items())]


def runner_adverts(refs: Sequence[str] = ()) -> RunnerAdverts:
    """This runner's advertisement: the built-ins, the installed entry points, and ``refs``
    (``module:object`` references or entry-point names this runner was configured with).

    A configured ref that does not load raises ``BenchmarkError`` (the runner refuses to start
    rather than take jobs it cannot run); an entry point that does not load is logged and left
    out (another distribution's fault)."""
    adverts = builtin_adverts()
    named = {n for a in adverts for n in a.names}
    for name, ep in sorted(_entry_point_benchmarks().items()):
        if name in named:
            continue
        try:
            adverts.append(advert_for([name, ep.value]))
        except BenchmarkError as exc:
            log.warning("entry point %r of kernelab.benchmarks is not offered: %s", name, exc)
            continue
        named.update(adverts[-1].names)
    for ref in refs:
        if ref not in named:
            adverts.append(advert_for([ref]))
            named.add(ref)
    return RunnerAdverts(benchmarks=adverts)


def shipped_text() -> str:
    """The text of ``service/contract/builtin_adverts.json`` as the code describes the built-ins now."""
    adverts = RunnerAdverts(benchmarks=builtin_adverts(with_version=False))
    return adverts.model_dump_json(indent=1, exclude_defaults=False) + "\n"


def _shipped_path() -> Path:
    import kernelab.service.contract

    return Path(kernelab.service.contract.__file__).resolve().parent / BUILTIN_ADVERTS


def main(argv: Sequence[str] | None = None) -> int:
    """``--print REF...``: this runner's advertisement as JSON on stdout (exit 2 with the reason
    on stderr when a configured ref does not load); ``--write``: regenerate the shipped file;
    ``--check``: exit 1 when it differs from the code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--print"]:
        # benchmark modules' import-time code runs here: what it starts and detaches dies with this
        # process, which dies with the daemon (kernelab.runners.reaper)
        become_subreaper()
        die_with_parent(signal.SIGKILL)
        try:
            adverts = runner_adverts(args[1:])
        except BenchmarkError as exc:
            print(f"benchmark: {exc}", file=sys.stderr)
            return 2
        finally:
            kill_descendants()
        sys.stdout.write(adverts.model_dump_json() + "\n")
        return 0
    path, text = _shipped_path(), shipped_text()
    if args == ["--write"]:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
        return 0
    if args == ["--check"]:
        if path.read_text(encoding="utf-8") != text:
            print(f"{path} is stale: run python -m kernelab.runners.adverts --write", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m kernelab.runners.adverts --print [REF...] | --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
