"""Repository functions over the ORM, one module per kind of record.

Every function takes ``*, session`` and never commits: the request (or the CLI command) commits
once, so a result is stored whole or not at all. Queue state changes live in
``kernelab.service.server.queue`` (jobs) and ``kernelab.service.server.compare_queue`` (comparisons).

* ``ingest``: a posted result checked against its job and stored (cells, sample blocks), and read
  back as a ``JobResult``;
* ``samples``: raw samples read in blocks and rows (exports, figures);
* ``comparisons``: the stored comparison of a result and its state;
* ``jobs``: jobs and their attempts as API views; a spec checked as a submission, a job re-run;
* ``nodes``: runners and nodes: registration, probe reports, node summaries.

This package re-exports every name, so callers write ``crud.store_result(...)``.
"""

from kernelab.service.server.crud.comparisons import (
    StoredComparison,
    base_comparison,
    save_comparison,
    stored_comparison,
)
from kernelab.service.server.crud.ingest import (
    ResultConflictError,
    ResultInvalidError,
    check_result_fits_job,
    has_result,
    load_result,
    result_id,
    store_result,
)
from kernelab.service.server.crud.jobs import (
    SpecInvalidError,
    accept_spec,
    attempts_page,
    job_benchmarks,
    job_public,
    list_jobs,
    rerun_job,
)
from kernelab.service.server.crud.nodes import (
    NodeSummary,
    count_nodes,
    list_nodes,
    node_summary,
    probe_readings,
    recent_probe_reports,
    register_runner,
    runner_device_type,
    store_probe_report,
)
from kernelab.service.server.crud.samples import (
    SAMPLE_COLUMNS,
    BlockSlice,
    SampleBatch,
    count_samples,
    iter_sample_blocks,
    iter_sample_rows,
    load_cell_samples,
    read_sample_batch,
    sample_batches,
)

__all__ = [
    "BlockSlice",
    "NodeSummary",
    "ResultConflictError",
    "ResultInvalidError",
    "SAMPLE_COLUMNS",
    "SampleBatch",
    "SpecInvalidError",
    "StoredComparison",
    "accept_spec",
    "attempts_page",
    "base_comparison",
    "check_result_fits_job",
    "count_nodes",
    "count_samples",
    "has_result",
    "iter_sample_blocks",
    "iter_sample_rows",
    "job_public",
    "job_benchmarks",
    "list_jobs",
    "list_nodes",
    "load_cell_samples",
    "load_result",
    "node_summary",
    "probe_readings",
    "read_sample_batch",
    "recent_probe_reports",
    "register_runner",
    "rerun_job",
    "result_id",
    "runner_device_type",
    "sample_batches",
    "save_comparison",
    "store_probe_report",
    "store_result",
    "stored_comparison",
]
