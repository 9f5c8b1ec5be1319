"""``dledger console``: a web console for broker groups and clusters (docs/console.md)."""
