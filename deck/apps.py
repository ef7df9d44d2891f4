from django.apps import AppConfig


class DeckConfig(AppConfig):
    name = "deck"
    verbose_name = "The Deck"

    def ready(self) -> None:
        from deck import checks
        from deck.permissions import check_policy

        checks.register()
        check_policy()  # a contradictory CHOKAQ_DECK policy stops the process at start-up (spec 04 §8)
