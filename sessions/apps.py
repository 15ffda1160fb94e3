from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # "sessions" would clash with django.contrib.sessions: always use this label.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401  (registers system checks)
