"""The DuckDB matrix: migrations, writes, queries and bundle ingest. The only SQL in qualify."""
