"""A real S3 endpoint on loopback (moto's server), with the AWS environment pointing at it."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.request
from collections.abc import Iterator

import s3fs
from moto.server import ThreadedMotoServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_endpoint() -> Iterator[dict[str, str]]:
    """A started moto server and the AWS environment variables that reach it (set in
    ``os.environ`` until the block ends, then restored)."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    # moto keeps its buckets in process-wide state, which outlives a stopped server: when the
    # test order sets a module's fixtures up a second time on a worker, start empty.
    urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
    ).close()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # fsspec caches filesystems by their arguments, not by the endpoint in the environment:
    # a cached one would still point at another module's (stopped) server.
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield env
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
