"""Sources: where Service, EndpointSlice and Node objects come from. Each emits
``pyproxy.model.events.Event`` values to a sink (the tracker's ``apply``).

``apiserver`` is the only module in pyproxy that talks to the Kubernetes API;
``manifests`` reads a directory of YAML files and needs no cluster."""
