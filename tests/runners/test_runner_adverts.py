"""What a runner advertises (``kernelab.runners.adverts``): built from the code, in a child process,
and what the server routes by (a daemon without the benchmark never gets its job)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelab.runners.adverts import _shipped_path, main, shipped_text
from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import AdvertError, RunnerDaemon
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.service.contract.adverts import builtin_adverts
from kernelab.service.contract.schemas import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # server and runner processes

REF = "kl_offered:Bench"
MODULE = textwrap.dedent("""\
    from pydantic import Field

    from kernelab.kernels import Benchmark, Params


    class OParams(Params):
        N: int = Field(gt=0)


    class Bench(Benchmark[OParams]):
        name, Params, variants = "kl_offered", OParams, ("a", "b")

        def make_inputs(self, params, device, seed): raise RuntimeError("not a real benchmark")
        def prepare(self, variant, params, inputs): return lambda: None
        def reference(self, params, inputs): return None
        def work(self, params, variant): return None
    """)


def test_the_shipped_builtin_advertisement_matches_the_code() -> None:
    assert _shipped_path().read_text(encoding="utf-8") == shipped_text(), (
        "service/contract/builtin_adverts.json is stale: python -m kernelab.runners.adverts --write"
    )
    assert main(["--check"]) == 0
    names = {n for a in builtin_adverts().benchmarks for n in a.names}
    assert {"softmax", "matmul", "kernelab.kernels.softmax:SoftmaxBenchmark"} <= names


@pytest.fixture
def offered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "kl_offered.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(folder))  # the daemon's children (allow-listed) see it
    yield folder
    sys.modules.pop("kl_offered", None)


def test_the_daemon_describes_its_benchmarks_in_a_child_process(offered: Path, tmp_path: Path) -> None:
    client = KernelabClient("http://127.0.0.1:9", "unused-token")
    with RunnerDaemon(
        client, "adv", work_dir=tmp_path / "w", job_isolation="none", benchmarks=[REF]
    ) as runner:
        adverts = runner.advertise()
    mine = adverts.by_name()[REF]
    assert mine.variants == ["a", "b"] and mine.params_schema["properties"]["N"]["exclusiveMinimum"] == 0
    assert mine.code_version is not None and "+" in mine.code_version
    assert "softmax" in adverts.by_name()
    assert "kl_offered" not in sys.modules  # imported by the child only
    with RunnerDaemon(
        client, "bad", work_dir=tmp_path / "b", job_isolation="none", benchmarks=["kl_nothere:X"]
    ) as bad:
        with pytest.raises(AdvertError, match="kl_nothere"):
            bad.advertise()
    client.close()


def test_a_daemon_that_does_not_offer_a_benchmark_never_claims_its_job(offered: Path, tmp_path: Path) -> None:
    token = admin_token(tmp_path)
    server = ServerProcess(f"sqlite:///{tmp_path / 'k.db'}", port=free_port(), admin_token=token,
                           log_path=tmp_path / "server.log").start()  # fmt: skip
    try:
        with KernelabClient(server.url, token, retries=1, backoff_s=0.05) as admin:
            job = admin.submit(JobSpec.model_validate({
                "benchmark": REF, "baseline": {"variant": "a"}, "candidate": {"variant": "b"},
                "sweep": {"N": [4]}, "device": "cpu", "timeout_s": 120,
                "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            }))  # fmt: skip
            assert job.waiting_for is not None
            kwargs = {"once": True, "job_isolation": "none", "poll_s": 0.5}
            with RunnerDaemon(admin, "plain", work_dir=tmp_path / "plain", **kwargs) as plain:  # type: ignore[arg-type]
                plain.run()
            assert (plain.done, plain.failed) == (0, 0) and admin.get_job(job.id).status == "queued"
            with RunnerDaemon(
                admin, "offers", work_dir=tmp_path / "offers", benchmarks=[REF], **kwargs
            ) as offers:  # type: ignore[arg-type]
                offers.run()
            after = admin.get_job(job.id)
            assert after.attempts == 1 and after.node == "offers", after
    finally:
        server.stop()


def test_a_relative_work_dir_is_made_absolute_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--work-dir runner`` (relative): the listing child runs with its scratch as cwd, so a
    relative work dir was joined twice (``runner/adverts/runner/adverts``, "cannot isolate")."""
    monkeypatch.chdir(tmp_path)
    client = KernelabClient("http://127.0.0.1:9", "unused-token")
    with RunnerDaemon(client, "rel", work_dir=Path("runner"), job_isolation="auto") as runner:
        assert runner.work_dir == tmp_path / "runner" and runner.supervisor.work_dir.is_absolute()
        assert "softmax" in runner.advertise().by_name()
    assert not (tmp_path / "runner" / "adverts" / "runner").exists()
    client.close()


def test_a_module_in_the_runners_folder_only_is_refused_with_the_pythonpath_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's children never run in its current folder (the job sandbox), so a module that is
    only a file there does not import: the error says to add its folder to PYTHONPATH."""
    (tmp_path / "kl_here_only.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    client = KernelabClient("http://127.0.0.1:9", "unused-token")
    with RunnerDaemon(
        client, "cwd", work_dir=tmp_path / "w", job_isolation="none", benchmarks=["kl_here_only:Bench"]
    ) as runner:
        with pytest.raises(AdvertError, match=r"kl_here_only.*add the module's folder to PYTHONPATH"):
            runner.advertise()
    client.close()
