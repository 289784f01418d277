"""Node-health probes, one module each: what a probe reads, its health rule and how it is shown.

Each module registers one ``kernelab.service.contract.schemas.probe_protocol.Probe`` (its readings, units,
runner function, health rule, text section, dashboard table, history panel); ``ProbeReport``
(``kernelab.service.contract.schemas.probes``) has one field per registered probe. Adding a probe is a module
here (and its tests); the runner side of the built-in probes is ``kernelab.runners.probes``.

The schemas are imported first: they import every module here before ``ProbeReport`` is built, so
importing one of them on its own registers all of them in the same order.
"""

import kernelab.service.contract.schemas  # noqa: F401  (builds ProbeReport, importing every probe first)
