"""Swagger UI works offline: the page loads only assets the app itself serves."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from service.models import JobCreate


def test_docs_page_uses_only_local_assets(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)
    assert urls, page.text
    for url in urls:
        assert url.startswith("/"), f"{url} is not served by the app"
        r = client.get(url)
        assert r.status_code == 200, url
        assert len(r.content) > 100, url


def test_every_route_has_a_summary_and_the_example_is_valid(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert op.get("summary"), f"{method.upper()} {path} has no summary"
    post = spec["paths"]["/api/v1/jobs"]["post"]
    examples = post["requestBody"]["content"]["application/json"]["examples"]
    for example in examples.values():
        JobCreate.model_validate(example["value"])
    fields = spec["components"]["schemas"]["JobCreate"]["properties"]
    assert fields["recipe"]["description"] and fields["batch_size"]["description"]
