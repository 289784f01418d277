"""Pure judgement: statistics, estimators, verdicts, health rules and reports. Imports the
contract and itself, never the server (no ORM, database or route; ``tests/test_house.py``)."""
