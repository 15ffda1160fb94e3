"""ASGI routing: the SSE stream goes to a channels consumer (no thread per open
stream), every other HTTP request to Django, and the worker channel to the
worker's consumer (sessions/worker/consumer.py)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "alineo_site.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

# Set up Django (apps, models) before anything below imports a model.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ChannelNameRouter, ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from sessions.api.direct import DirectWrites  # noqa: E402
from sessions.api.stream import SandboxSessionStream, TranscriptStream  # noqa: E402
from sessions.api.tree_stream import TreeStream  # noqa: E402
from sessions.worker.consumer import WorkerConsumer  # noqa: E402

STREAM_ROUTE = r"^api/agents/(?P<agent_id>[^/]+)/stream/?$"
# The tree: a workspace by name, or the caller's first one (before the agent route).
TREE_STREAM_ROUTE = r"^api/workspaces/(?P<agent_id>[^/]+)/stream/?$"
DEFAULT_TREE_STREAM_ROUTE = r"^api/agents/stream/?$"
SANDBOX_STREAM_ROUTE = r"^api/sandboxes/(?P<agent_id>[^/]+)/stream/?$"

application = ProtocolTypeRouter(
    {
        # Outermost: daphne's request object for the streams' direct writes.
        "http": DirectWrites(URLRouter(
            [
                re_path(DEFAULT_TREE_STREAM_ROUTE, AuthMiddlewareStack(TreeStream.as_asgi())),
                re_path(TREE_STREAM_ROUTE, AuthMiddlewareStack(TreeStream.as_asgi())),
                re_path(STREAM_ROUTE, AuthMiddlewareStack(TranscriptStream.as_asgi())),
                re_path(SANDBOX_STREAM_ROUTE, AuthMiddlewareStack(SandboxSessionStream.as_asgi())),
                re_path(r"", django_asgi_app),
            ]
        )),
        "channel": ChannelNameRouter({settings.ALINEO_WORKER_CHANNEL: WorkerConsumer.as_asgi()}),
    }
)
