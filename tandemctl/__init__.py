"""tandemctl: Tandem's command-line client, a thin layer over the REST API (/api/schema/ is its contract)."""
