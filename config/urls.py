from django.contrib import admin
from django.urls import path

from chokaq_core import ops_views
from deck.views import overview

urlpatterns = [
    path("admin/", admin.site.urls),
    path("deck/health/", ops_views.health, name="chokaq-health"),
    path("deck/metrics", ops_views.metrics, name="chokaq-metrics"),
    path("", overview, name="overview"),
]
