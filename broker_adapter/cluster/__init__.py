"""Many broker groups behind name servers: the local cluster runner, its CLI and the cluster clients
(docs/cluster.md)."""
