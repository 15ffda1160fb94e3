"""ASGI routing: the SSE stream goes to a channels consumer (no thread per open
stream), every other HTTP request to Django, and the worker channel to the
worker consumer."""

import importlib.util
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alineo_site.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

# Set up Django (apps, models) before anything below imports a model.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.consumer import AsyncConsumer  # noqa: E402
from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from sessions.stream import TranscriptStream  # noqa: E402

STREAM_ROUTE = r"^api/agents/(?P<agent_id>[^/]+)/stream/?$"


class _NoWorker(AsyncConsumer):
    """Stands in until sandboxes/worker.py exists: accepts and drops messages."""

    async def dispatch(self, message):
        pass


def _worker_app():
    """The worker consumer, looked up lazily so this module loads before
    sandboxes/worker.py exists. If the module exists, its import errors are real
    errors and propagate."""
    app = None

    async def worker(scope, receive, send):
        nonlocal app
        if app is None:
            if importlib.util.find_spec("sandboxes.worker") is not None:
                from sandboxes.worker import WorkerConsumer

                app = WorkerConsumer.as_asgi()
            else:
                app = _NoWorker.as_asgi()
        return await app(scope, receive, send)

    return worker


application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(STREAM_ROUTE, AuthMiddlewareStack(TranscriptStream.as_asgi())),
                re_path(r"", django_asgi_app),
            ]
        ),
        "channel": ChannelNameRouter({settings.ALINEO_WORKER_CHANNEL: _worker_app()}),
    }
)
