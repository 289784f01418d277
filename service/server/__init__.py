"""The server: HTTP API, database models and crud, queue, compare worker, node health and
history over stored results. Imports the contract and the judge; the runner never imports it
(``tests/test_house.py``)."""
