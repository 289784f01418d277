"""Server core: settings and the database (engine, sessions, Alembic upgrade)."""
