from typing import Any

from django.apps import AppConfig


def close_sockets_of_ended_session(sender: Any, **kwargs: Any) -> None:
    """``user_logged_out`` receiver. A logout happens in a web process, so only there is ``deck.consumers``
    (channels, the engine's read service, the fragments) imported: a worker that loads the Deck app does not."""
    from deck import consumers

    consumers.close_sockets_of_ended_session(sender, **kwargs)


def record_shell_command(sender: Any, **kwargs: Any) -> None:
    """``events.operator_command`` receiver: the Deck's audit log, imported when a shell command runs (the
    worker process, which never sends it, loads neither the Deck's views nor the engine's service)."""
    from deck import views

    views.record_shell_command(sender, **kwargs)


class DeckConfig(AppConfig):
    name = "deck"
    verbose_name = "The Deck"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from chokaq_core.events import operator_command
        from deck import checks
        from deck.permissions import check_policy

        checks.register()
        check_policy()  # a contradictory CHOKAQ_DECK policy stops the process at start-up (spec 04 §8)
        # a logout closes that session's live sockets at once, in every web process
        user_logged_out.connect(close_sockets_of_ended_session, dispatch_uid="deck.close_sockets_of_ended_session")
        # a command an operator runs from a shell (manage.py chokaq_queue) joins the Deck's audit log
        operator_command.connect(record_shell_command, dispatch_uid="deck.record_shell_command")
