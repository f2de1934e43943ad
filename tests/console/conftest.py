"""The console's tests: the API fixture (a real supervisor on a unix socket) for the plain HTTP ones."""

from tests.api.conftest import api  # noqa: F401  (the API fixture)
