"""One router module per resource, joined in ``service.api``."""
