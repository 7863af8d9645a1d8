"""pyproxy's one typed configuration: flags and a KubeProxyConfiguration file merged into a
frozen, validated ``ProxyConfig`` at start (``load``), from which backends are built.

Depends only on the model."""

from pyproxy.config.settings import DetectLocalMode, Masquerade, ProxyConfig, Source

__all__ = ["DetectLocalMode", "Masquerade", "ProxyConfig", "Source"]
