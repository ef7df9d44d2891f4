from django.contrib import admin
from django.urls import include, path

from chokaq_core import ops_views
from deck.urls import route_prefix
from deck.views import root

PREFIX = route_prefix()  # CHOKAQ_DECK["ROUTE_PREFIX"], "deck" by default

urlpatterns = [
    path("admin/", admin.site.urls),
    path(f"{PREFIX}/health/", ops_views.health, name="chokaq-health"),
    path(f"{PREFIX}/metrics", ops_views.metrics, name="chokaq-metrics"),
    path(f"{PREFIX}/", include("deck.urls")),
    path("", root, name="root"),
]
