"""The sync core: when and what to sync, never how.

``tracker`` turns source events into the proxy state and what changed since the last sync;
``runner`` decides when a sync runs (bounded frequency, retry with backoff); ``syncer`` runs
one sync against the backend interface and records it. Nothing here knows a backend
implementation or the kernel.
"""
