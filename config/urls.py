from django.contrib import admin
from django.urls import path

from deck.views import overview

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", overview, name="overview"),
]
