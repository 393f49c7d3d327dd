"""A local S3-compatible server for tests, the example and benchmarks: s3proxy on 127.0.0.1.

s3proxy (Apache-2.0, ``org.gaul:s3proxy:4.1.0:jar-with-dependencies`` on Maven Central) keeps
objects in a local directory and answers conditional PUTs (``If-None-Match``, ``If-Match``)
with 412 as S3 does -- what delta-rs commits and the writer lease rely on.  The jar is fetched
once into the project's cache folder (``airflow_trickle.spark.jars.maven_artifact``).

``with S3Server(directory) as s3:`` gives ``s3.warehouse`` (``s3://trickle/warehouse``) and
``s3.storage_options`` (the endpoint, its credentials, ``aws_allow_http``).
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import urllib.error
import urllib.request

from tests.helpers.servers import LocalServer

S3PROXY = ("org.gaul", "s3proxy", "4.1.0")
ACCESS_KEY = "trickle"
SECRET_KEY = "trickle-secret-key"
REGION = "us-east-1"


class S3Server(LocalServer):
    """s3proxy serving ``bucket`` from ``directory``; started on enter, stopped on exit."""

    name = "s3proxy"

    def __init__(self, directory: str | os.PathLike, *, bucket: str = "trickle", prefix: str = "warehouse"):
        super().__init__(directory)
        self.bucket = bucket
        self.prefix = prefix

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def storage_options(self) -> dict[str, str]:
        return {"aws_endpoint": self.endpoint, "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY, "aws_region": REGION, "aws_allow_http": "true"}

    def command(self) -> list[str]:
        from airflow_trickle.spark.jars import maven_artifact

        jar = maven_artifact(*S3PROXY, classifier="jar-with-dependencies")
        data = self.directory / "objects"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "s3proxy.properties"
        conf.write_text("\n".join([
            f"s3proxy.endpoint={self.endpoint}", "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={ACCESS_KEY}", f"s3proxy.credential={SECRET_KEY}",
            "jclouds.provider=filesystem-nio2", f"jclouds.filesystem.basedir={data}", ""]))
        return ["java", "-Xmx256m", "-jar", str(jar), "--properties", str(conf)]

    def ready(self) -> None:
        self.create_bucket(self.bucket)

    def create_bucket(self, bucket: str) -> None:
        """``PUT /bucket``, signed with AWS Signature Version 4 (s3proxy sees a directory made
        behind its back as no bucket)."""
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT", data=b"",
                                         headers=_signed_headers("PUT", self.port, f"/{bucket}", b""))
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as err:
            if err.code != 409:  # BucketAlreadyOwnedByYou
                raise

    def objects(self, prefix: str = "") -> list[str]:
        """Keys stored under ``prefix`` of the bucket (read from the server's directory)."""
        root = self.directory / "objects" / self.bucket
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                      and str(p.relative_to(root)).startswith(prefix))


def _signed_headers(method: str, port: int, path: str, body: bytes) -> dict[str, str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    host = f"127.0.0.1:{port}"
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload])
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{SECRET_KEY}".encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {"x-amz-content-sha256": payload, "x-amz-date": amz_date,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={signed}, "
                             f"Signature={signature}"}
