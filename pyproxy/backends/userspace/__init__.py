"""userspace mode: an asyncio relay per service port (``relay``) behind REDIRECT rules
(``backend``)."""
