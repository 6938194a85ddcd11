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


def test_every_route_declares_the_errors_it_answers(client: TestClient) -> None:
    """The document names every status the API gives, each error with the
    ``{"detail": ...}`` body it carries, so Swagger and generated clients tell the truth."""
    spec = client.get("/openapi.json").json()
    error_body = {"$ref": "#/components/schemas/ErrorDetail"}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            answers, where = op["responses"], f"{method.upper()} {path}"
            if path.startswith("/api/v1/"):
                for status in ("401", "503"):  # the token; the database down
                    schema = answers[status]["content"]["application/json"]["schema"]
                    assert schema == error_body, where
            names_one = "{job_id}" in path or "{digest}" in path
            if names_one and method != "put":  # an upload creates what its digest names
                assert "404" in answers, where
            if method in ("post", "put", "delete"):
                assert "403" in answers, where  # a write from another site's page
    submit = spec["paths"]["/api/v1/jobs"]["post"]["responses"]
    assert {"400", "409", "413", "422"} <= submit.keys()
    detail = spec["components"]["schemas"]["ErrorDetail"]["properties"]["detail"]
    assert detail["description"]
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
