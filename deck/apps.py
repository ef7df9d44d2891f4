from django.apps import AppConfig


class DeckConfig(AppConfig):
    name = "deck"
    verbose_name = "The Deck"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from chokaq_core.service import operator_command
        from deck import checks
        from deck.consumers import close_sockets_of_ended_session
        from deck.permissions import check_policy
        from deck.views import record_shell_command

        checks.register()
        check_policy()  # a contradictory CHOKAQ_DECK policy stops the process at start-up (spec 04 §8)
        # a logout closes that session's live sockets at once, in every web process
        user_logged_out.connect(close_sockets_of_ended_session, dispatch_uid="deck.close_sockets_of_ended_session")
        # a command an operator runs from a shell (manage.py chokaq_queue) joins the Deck's audit log
        operator_command.connect(record_shell_command, dispatch_uid="deck.record_shell_command")
