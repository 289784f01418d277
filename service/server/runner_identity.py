"""A runner token speaks for one node: probe reports and results for another node are refused.

A runner row is bound to a node name (``runners.node_name``, a ``NodeInfo.hostname``) when it is
registered with a node (``POST /runners/register``, an admin call; ``crud.register_runner``). A
runner registered without a node, or migrated from before the binding existed without one, is
bound by its first probe report or result (first use). Every token of the runner (re-issued by
``/tokens/{id}/rotate``) carries the binding; only a new registration by an admin changes it.

Claims, heartbeats and failure reports name no node (the lease says which runner holds a job), so
there is nothing there to check; a result's ``node.hostname`` and a probe's ``/nodes/{name}`` are
checked here, before anything is stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import HTTPException, status
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kernelab.service.server.auth import Principal
from kernelab.service.server.models import Runner


def node_mismatch(loc: Sequence[str | int], claimed: str, bound: str) -> HTTPException:
    """The 403 for a runner speaking for another node: ``detail`` in FastAPI's validation format
    (``[{"loc", "msg", "type": "node_mismatch"}]``) so it names the field."""
    msg = (f"this runner token is bound to node {bound!r}; it cannot report for node {claimed!r} "
           "(an admin re-registers the runner to move it to another node)")  # fmt: skip
    return HTTPException(status.HTTP_403_FORBIDDEN, [{"loc": list(loc), "msg": msg, "type": "node_mismatch"}])


def check_node(session: Session, principal: Principal, node_name: str, *, loc: Sequence[str | int]) -> None:
    """Allow ``principal`` (a runner) to report for ``node_name``, binding an unbound runner to it.

    ``loc`` names the field that carries the node name (``("path", "name")``,
    ``("body", "node", "hostname")``). Binding is one conditional ``UPDATE`` (``... WHERE
    node_name IS NULL``), so of two first uses racing, one binds and the other is then judged
    against it. Does not commit. Raises ``HTTPException`` 403 (``node_mismatch``) when the runner
    is bound to another node.
    """
    if principal.runner_id is None:  # deps.authorize guarantees a runner for the runner scope
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this runner token is not bound to a runner")
    bound = principal.node_name
    if bound is None:
        session.execute(
            update(Runner).where(Runner.id == principal.runner_id, Runner.node_name.is_(None))
            .values(node_name=node_name)
        )  # fmt: skip
        bound = session.scalar(select(Runner.node_name).where(Runner.id == principal.runner_id))
    if bound != node_name:
        raise node_mismatch(loc, node_name, bound or "")
