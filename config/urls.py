from django.contrib import admin
from django.urls import include, path

from chokaq_core import ops_views
from deck.views import root

urlpatterns = [
    path("admin/", admin.site.urls),
    path("deck/health/", ops_views.health, name="chokaq-health"),
    path("deck/metrics", ops_views.metrics, name="chokaq-metrics"),
    path("deck/", include("deck.urls")),
    path("", root, name="root"),
]
