"""What pyproxy serves over HTTP: proxy health (/healthz, /livez), Prometheus metrics
(/metrics, /proxyMode) and the health-check node ports of LoadBalancer services."""
