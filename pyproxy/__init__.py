"""pyproxy: a node-level Kubernetes Service proxy.

Data flow, one package each: ``sources`` (API server or manifests directory) emit object
events -> ``tracker`` keeps the proxy state and what changed -> ``runner`` decides when to
sync -> a ``backends`` backend renders the state (pure) and applies it through ``kernel``.
``model`` holds the value objects all of them share and depends on nothing.
"""

__version__ = "0.1.0"
