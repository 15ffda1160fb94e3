from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("sessions.api.urls")),
    path("", include("sessions.urls")),
]

# JSON under /api/, Django's usual pages elsewhere: an API client never gets HTML.
handler400 = "sessions.api.views.handler400"
handler403 = "sessions.api.views.handler403"
handler404 = "sessions.api.views.handler404"
handler500 = "sessions.api.views.handler500"
