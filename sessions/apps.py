from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # "sessions" would clash with django.contrib.sessions: always use this label.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.backends.signals import connection_created

        from . import checks  # noqa: F401  (registers system checks)
        from . import durability

        # Every connection of every process is read back: never a non-durable one.
        connection_created.connect(durability.on_connection, dispatch_uid="alineo-durability")
