"""The wire contract: what runner and server exchange (specs, results, samples, units, clock
events, sample blocks, benchmark adverts, repository addresses). Pure data and validation: imports
pydantic, numpy and itself, never the judge or the server (``tests/test_house.py``)."""
