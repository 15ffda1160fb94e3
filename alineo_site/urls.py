from django.contrib import admin
from django.urls import include, path

from sessions import views

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("sessions.api.urls")),
]
