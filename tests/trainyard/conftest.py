"""The client's tests run against a real server, as the end-to-end tests do."""

from tests.e2e.conftest import stack  # noqa: F401  (the same fixture: a server per test)
