from django.apps import AppConfig


class DeckConfig(AppConfig):
    name = "deck"
    verbose_name = "The Deck"
