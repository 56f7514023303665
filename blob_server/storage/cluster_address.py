"""Where a Redis Cluster is and how to log in to it: ``--redis-cluster``'s two forms.

* ``HOST:PORT[,HOST:PORT...]``: some of the cluster's nodes, no user, no TLS.
* ``redis://[[user]:password@]HOST:PORT[,HOST:PORT...]``, ``rediss://...`` for TLS: the
  redis-py URL an operator already writes for one Redis (``--redis``), with several
  nodes. TLS options are redis-py's URL query options of the same names:
  ``?ssl_ca_certs=CA.pem`` (the CA that signed the nodes' certificates; default: the
  system's), ``ssl_certfile=`` and ``ssl_keyfile=`` (a client certificate, for nodes
  with ``tls-auth-clients yes``), ``ssl_check_hostname=false`` (nodes whose
  certificates do not name the addresses the cluster announces).

The user part ends at the URL's last ``@``, so a password may hold ``?``, ``/`` or
``#`` as typed; an ``@`` in an option's value must be written ``%40``. Error messages
never repeat text that did not parse as a host and port: it may be part of a password.

*Why a separate password*: a password in a URL sits in the process list and in shell
history; ``zerodb-server serve --redis-password-file`` reads it from a file instead and
hands it here. The user (an ACL user) may still be in the URL: it is no secret.

Every connection the storage makes (the cluster client, the asyncio one of the commit
leases, the subscribers of ``cluster_changes``) takes the same ``connection_options``.
The password appears in no ``url``, ``repr`` or message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from redis.cluster import ClusterNode

from blob_server.exceptions import StorageUnavailableError

_SCHEMES = ("redis", "rediss")
#: The TLS query options taken (redis-py's names); any other option is refused rather
#: than ignored, so a misspelt CA file never silently means "the system's CAs".
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
#: ``ssl_check_hostname``'s values: a typo is refused, not read as "true".
_FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
#: A node: a host name or IPv4 address, or a bracketed IPv6 address, then a port.
_NODE = re.compile(r"(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")
_FORMS = "HOST:PORT[,HOST:PORT...] or redis://[[user]:password@]HOST:PORT[,...]"


@dataclass(frozen=True)
class ClusterAddress:
    """The startup nodes, credentials and TLS options of a Redis Cluster.

    ``url`` names it without the password, for messages (the bare form keeps its
    ``redis-cluster://`` prefix)."""

    nodes: tuple[ClusterNode, ...]
    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: dict[str, Any] | None = None  # None: no TLS; else the ssl_* options

    def connection_options(self) -> dict[str, Any]:
        """The keyword arguments of redis-py's clients and connections (both the blocking
        and the asyncio ``RedisCluster`` take them, and so do the asyncio ``SSLConnection``
        with ``ssl`` left out): user, password, and the TLS options."""
        options: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.tls is not None:
            options.update(ssl=True, **self.tls)
        return options


def parse_cluster_address(spec: str, *, password: str | None = None) -> ClusterAddress:
    """Parse ``spec`` (either form, see the module doc); ``password`` is one given apart
    (read from a file): giving it in the URL as well is refused, as ambiguous."""
    scheme, sep, rest = spec.strip().partition("://")
    if not sep:
        if "@" in spec:
            raise StorageUnavailableError(
                f"a user or password for a Redis Cluster needs the URL form: {_FORMS}"
            )
        nodes = _parse_nodes(spec)
        return ClusterAddress(nodes, _url("redis-cluster", None, nodes), password=password)
    if scheme.lower() not in _SCHEMES:
        raise StorageUnavailableError(
            f"bad Redis Cluster address scheme {scheme!r}: use HOST:PORT[,HOST:PORT...], "
            "redis://[[user]:password@]HOST:PORT[,...] or rediss://..."
        )
    scheme = scheme.lower()
    userinfo, at, rest = rest.rpartition("@")
    hosts, _, query = rest.partition("?")
    username: str | None = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        if colon and secret:
            if password is not None:
                raise StorageUnavailableError(
                    "the Redis Cluster password is both in the URL and in a password file: "
                    "give it once"
                )
            password = unquote(secret)
    hosts, _, path = hosts.partition("/")
    if path not in ("", "0"):
        raise StorageUnavailableError(
            f"a Redis Cluster has only database 0, not {path!r}: leave the /db out"
        )
    nodes = _parse_nodes(hosts)
    tls = _tls_options(query) if scheme == "rediss" else None
    if tls is None and query:
        raise StorageUnavailableError(
            f"Redis Cluster URL options ({query.split('=')[0]}, ...) need TLS: use rediss://"
        )
    return ClusterAddress(nodes, _url(scheme, username, nodes), username, password, tls)


def _parse_nodes(spec: str) -> tuple[ClusterNode, ...]:
    """``HOST:PORT[,HOST:PORT...]`` as redis-py's startup nodes."""
    nodes = []
    for number, part in enumerate(spec.split(","), 1):
        node = _NODE.fullmatch(part.strip())
        if node is None or not 0 < int(node["port"]) < 65536:
            raise StorageUnavailableError(f"bad Redis Cluster node #{number}: use {_FORMS}")
        nodes.append(ClusterNode(node["host"].strip("[]"), int(node["port"])))
    return tuple(nodes)


def _tls_options(query: str) -> dict[str, Any]:
    """The ``TLS_OPTIONS`` of a ``rediss://`` URL's query (file paths, and a flag)."""
    options: dict[str, Any] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name not in TLS_OPTIONS:
            raise StorageUnavailableError(
                f"unknown Redis Cluster URL option {name!r}: expected {', '.join(TLS_OPTIONS)}"
            )
        value = values[-1]
        if name == "ssl_check_hostname":
            if value.lower() not in _FLAGS:
                raise StorageUnavailableError(
                    f"bad value for {name} in the Redis Cluster URL: {value!r} (true or false)"
                )
            options[name] = _FLAGS[value.lower()]
        else:
            options[name] = value
    if ("ssl_certfile" in options) != ("ssl_keyfile" in options):
        raise StorageUnavailableError("ssl_certfile and ssl_keyfile go together")
    return options


def _url(scheme: str, username: str | None, nodes: tuple[ClusterNode, ...]) -> str:
    user = f"{username}@" if username else ""
    hosts = (f"[{n.host}]" if ":" in n.host else n.host for n in nodes)  # IPv6 bracketed
    return f"{scheme}://{user}" + ",".join(f"{h}:{n.port}" for h, n in zip(hosts, nodes))
