"""The sync engine every kernel-programming mode shares: a per-service render cache
(``cache``) and the per-family sync loop (``engine``). A mode supplies what is its own."""
