"""Ray Serve deployments over `madr` (the hybrid query encoder and sharded searcher)."""
