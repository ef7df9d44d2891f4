"""The demo project's URLs: the admin, the Deck (one include) and the example shop at the site root."""

from django.contrib import admin
from django.urls import include, path

from deck.urls import route_prefix

handler400 = "deck.views.bad_request"  # Deck refusals stay JSON (a toast), even before a view runs

urlpatterns = [
    path("admin/", admin.site.urls),
    path(f"{route_prefix()}/", include("deck.urls")),  # CHOKAQ_DECK["ROUTE_PREFIX"], "deck" by default
    path("", include("shop.urls")),
]
