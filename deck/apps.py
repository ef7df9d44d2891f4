from django.apps import AppConfig


class DeckConfig(AppConfig):
    name = "deck"
    verbose_name = "The Deck"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from deck import checks
        from deck.consumers import close_sockets_of_ended_session
        from deck.permissions import check_policy

        checks.register()
        check_policy()  # a contradictory CHOKAQ_DECK policy stops the process at start-up (spec 04 §8)
        # a logout closes that session's live sockets at once, in every web process
        user_logged_out.connect(close_sockets_of_ended_session, dispatch_uid="deck.close_sockets_of_ended_session")
