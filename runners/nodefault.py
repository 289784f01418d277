"""Faults of the node, never of the job: a full disk, a full file table, a file quota.

A job's process that cannot write its output because the node's disk is full did nothing wrong:
another node (or this one, once it has room) measures the same job. So an error whose cause is
one of ``NODE_ERRNOS`` (``errno(3)``: ``ENOSPC`` no space left on the device, ``EDQUOT`` disk
quota exceeded, ``EMFILE`` too many open files in the process, ``ENFILE`` in the system) is a
*node fault*: the measuring child (``kernelab.runners.measure``) and the worker
(``kernelab.runners.worker``) exit with ``EXIT_NODE_FAULT`` and a ``NODE_FAULT_MARK`` line on
stderr instead of failing the job, and the daemon hands the job back (re-queued with the reason,
while it has attempts left) and claims nothing until its work dir takes writes again.

The cause is found in the exception itself, its ``__cause__``/``__context__`` chain, or, for an
error that crossed a process boundary as text (a side worker's answer, a child's last stderr
line, git's message), in its text: Python's ``[Errno N]`` form or the C library's message for
one of those numbers (``os.strerror``).

``EMFILE`` counts although a job can cause it itself (a leak of file descriptors): the job is then
re-queued until its attempts are used up, never retried for ever (``kernelab.service.server.queue.fail``).
"""

from __future__ import annotations

import errno
import os
import re

EXIT_NODE_FAULT = 4  # worker and measuring child: the node could not take the job's writes
NODE_FAULT_MARK = "node fault: "  # the line on stderr that says which (after the process's prefix)
NODE_FAULT_LINE = "kernelab-node-fault: "  # the same on stdout, a pipe to the parent: never full
NODE_ERRNOS = {
    errno.ENOSPC: "ENOSPC",
    errno.EDQUOT: "EDQUOT",
    errno.EMFILE: "EMFILE",
    errno.ENFILE: "ENFILE",
}
_TEXT = re.compile(
    "|".join([rf"\[Errno {n}\]" for n in NODE_ERRNOS] + [re.escape(os.strerror(n)) for n in NODE_ERRNOS])
)


class NodeFault(RuntimeError):
    """The node, not the job, made this run fail (``node_fault`` of its cause says which)."""


def node_fault_text(text: str) -> str:
    """The first line of ``text`` that names a node fault (``[Errno 28]``, ``No space left on
    device``, ...), stripped, or ``""``."""
    for line in text.splitlines():
        if _TEXT.search(line):
            return line.strip()
    return ""


def node_fault(exc: BaseException | None) -> str:
    """Why ``exc`` is a node fault (``"ENOSPC: [Errno 28] No space left on device: '/w/x'"``), or
    ``""`` when it is not: an ``OSError`` of ``NODE_ERRNOS``, a ``NodeFault``, or an exception whose
    text names one (``node_fault_text``), anywhere in its cause/context chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NODE_ERRNOS:
            return f"{NODE_ERRNOS[exc.errno]}: {exc}"
        if isinstance(exc, NodeFault):
            return str(exc)
        found = node_fault_text(str(exc))
        if found:
            return found
        exc = exc.__cause__ or exc.__context__
    return ""
