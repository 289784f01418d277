"""One router module per resource, joined in ``kernelab.service.server.api``."""
