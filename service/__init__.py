"""kernelab's service side, three rooms (``docs/architecture.md``, "Rooms"; ``tests/test_house.py``):

* ``kernelab.service.contract``: what runner and server exchange (schemas, samples, units, clock
  events, sample blocks, benchmark adverts, probe declarations); imports itself only;
* ``kernelab.service.judge``: pure judgement (statistics, estimators, verdicts, health rules,
  reports); imports the contract;
* ``kernelab.service.server``: the API, database, queue and workers; imports both.

This module imports nothing, so importing one room never loads another.
"""
