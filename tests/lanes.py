"""A lane for the end-to-end tier's waiting groups: pytest-xdist's `loadgroup`
scheduling with one worker more than the cores, that worker given only the
groups named as lanes (tests.tiers.E2E_LANE) and no other.

Why: the fault soak is one group of ~14 minutes of which about a third is CPU
(it waits out its scripted faults: a 100 s freeze, MLflow away, the stack's
zombie window). On one of two workers it held a core's share of the tier while
mostly idle. On a worker of its own it runs beside the two CPU-bound lanes, and
the tier's wall is theirs: (summed - soak) / 2 instead of summed / 2. A third
worker that took any group would instead run three CPU-bound groups on two
cores (slower tests, and timing-sensitive scenarios at risk: tests/conftest.py's
pytest_xdist_auto_num_workers says what four did).

The lane worker is the last one xdist names (gw2 of gw0-gw2); with no lane group selected it
gets nothing and stops at once. Where the lane worker is gone (a crash), its
groups may go to any worker, so nothing is left unrun."""

from __future__ import annotations

from xdist.scheduler.loadgroup import LoadGroupScheduling


def name_groups(config, items) -> None:
    """`--dist loadgroup` on pytest 9: pytest-xdist 3.8 puts a test's group into `item._nodeid`,
    which pytest 9 no longer reads (Item.nodeid comes from `item._id`), so its scheduler never saw
    a group. The same suffix, where pytest 9 reads it, on the workers (which collect; the
    controller does not). From a conftest's pytest_collection_modifyitems (trylast)."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)


class LaneScheduling(LoadGroupScheduling):
    """`loadgroup` where the last node runs only the groups in `lanes` and the
    other nodes never do (while that node is up)."""

    def __init__(self, config, log=None, lanes: tuple[str, ...] = ()):
        super().__init__(config, log)
        self.lanes = frozenset(lanes)
        self._lane = None

    def _fits(self, node, scope: str) -> bool:
        if self._lane is None or self._lane not in self.assigned_work:
            return True  # no lane (yet), or its worker is gone: any group anywhere
        return (scope in self.lanes) == (node is self._lane)

    def _next_scope(self, node) -> str | None:
        return next((scope for scope in self.workqueue if self._fits(node, scope)), None)

    def _assign_work_unit(self, node) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if self._next_scope(node) is None:
            node.shutdown()  # it ends after what it holds: nothing left here is for it
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)

    def schedule(self) -> None:
        if self._lane is None and self.nodes:  # the nodes in the order they came up: by name instead
            self._lane = max(self.nodes, key=lambda n: (len(n.gateway.id), n.gateway.id))
        super().schedule()
